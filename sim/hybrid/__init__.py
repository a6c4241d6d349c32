"""Hybrid models around SGLang 0.5.23's unified radix tree with an SWA or a Mamba
component beside FULL (docs/HYBRID.md). The trees themselves are in ``sim/tree/``
(``hybrid.py``: the core, holding component objects; ``components/swa.py``:
``SWAComponent``, ``SWATree``; ``components/mamba.py``: ``MambaComponent``,
``MambaTree``); this package re-exports the trees' names.

* ``gen.py``: generated hybrid op-traces;
* ``pools.py``: per-component pool sizing;
* ``replay.py``: hybrid op-traces (docs/HYBRID.md §6);
* ``replica.py``: a hybrid tree as one TP rank's replica in the engine, and the
  engine's hybrid admission and allocation hooks (docs/HYBRID.md §10).
"""

from sim.lazy import lazy_exports


# The trees' names, imported on first use (PEP 562): ``sim.hybrid.pools`` sizes a
# scenario's pools when it is loaded, and that should not load the trees themselves
# (about 2,500 lines) for every command that only reads a scenario.
_EXPORTS = {
    "HybridInvariantError": "sim.tree.hybrid",
    "HybridTree": "sim.tree.hybrid",
    "HybridTreeError": "sim.tree.hybrid",
    "LockReceipt": "sim.tree.hybrid",
    "MambaTree": "sim.tree.components.mamba",
    "SWATree": "sim.tree.components.swa",
}
__all__ = list(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
