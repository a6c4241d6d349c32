"""The components a hybrid tree (``sim/tree/hybrid.py``) holds beside FULL, after
SGLang 0.5.23's ``unified_cache/components/``: ``swa.py`` (``SWATree``) and
``mamba.py`` (``MambaTree``), each the core's ``_aux_*`` hooks for its component."""
