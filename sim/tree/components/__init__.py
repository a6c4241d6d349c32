"""The components a hybrid tree (``sim/tree/hybrid.py``) holds, after SGLang 0.5.23's
``unified_cache/components/``: ``base.py`` (``TreeComponent``, the interface, and the
component LRU lists), ``full.py`` (``FullComponent``), ``swa.py`` (``SWAComponent``
and the ``SWATree`` built with it) and ``mamba.py`` (``MambaComponent``,
``MambaTree``)."""
