"""hicache-sim: a discrete-event simulator of SGLang's HiCache across TP ranks.

Folders follow the layers of docs/ARCHITECTURE.md, bottom up: ``tree`` and
``policies`` (pure cache semantics), ``optrace`` (differential replay),
``costs``, ``workloads``, ``scenario``, ``collectives``, ``ranks``, ``events``
(SimPy processes), ``metrics``, ``analysis``; ``reports/`` and ``cli.py`` sit on top.
"""

__version__ = "0.1.0"
