"""The hybrid kinds, keyed by name: what differs between a (FULL, SWA) and a
(FULL, MAMBA) model where the engine and the scenario branch on it.

``HYBRID_KINDS[name]`` is a small object whose fields say what the branch tests
(``windowed``: running requests hold SWA tokens outside the tree;
``request_state``: each running request holds a Mamba state slot) and whose
methods do what differs (``build``: the replica's tree; ``host_equiv``: host
units priced as FULL-pool tokens). The name itself ("swa", "mamba") stays the
vocabulary of the files (scenario ``model.kind``, op-trace ``components``,
summary.json ``hybrid.kind``).
"""

from __future__ import annotations

# The trees are imported where a replica's tree is built (``build``): the scenario
# reads these kinds while it is validated, and loading one should not load the trees.


class HybridKind:
    """What one hybrid kind is to the engine and the scenario."""

    __slots__ = ()
    name = ""
    label = ""               # in refusals: "an SWA hybrid"
    windowed = False         # SWA: the component keeps a sliding window per request
    request_state = False    # Mamba: each running request holds a state slot
    host_units_are_pages = False  # the component's host slots come in token pages
    # scenario keys: the component's host pool (and what it holds), its device keys,
    # why a load-back threshold cannot refuse its loads (docs/HYBRID.md §5.7, §5.8)
    host_key = ""
    host_what = ""
    host_off = ""
    device_keys: tuple = ()
    threshold_why = ""

    def build(self, h, cfg):
        """The replica's tree for ``h`` (sim.config.HybridConfig) under ``cfg``."""
        raise NotImplementedError

    def host_equiv(self, h, aux: int) -> int:
        """``aux`` host units of the component as FULL-pool tokens of the same bytes."""
        raise NotImplementedError


class SWAKind(HybridKind):
    __slots__ = ()
    name = "swa"
    label = "an SWA hybrid"
    windowed = True
    host_units_are_pages = True
    host_key = "swa_tokens"
    host_what = "the host SWA pool, tokens"
    host_off = "a host tier for host SWA"
    device_keys = ("swa_full_tokens_ratio",)
    threshold_why = "SGLang's threshold never refuses an SWA load-back with its window on host"

    def build(self, h, cfg):
        from sim.tree.components.swa import SWATree

        host = h.host_tokens if h.host_tokens else None
        return SWATree(device_capacity=cfg.device_tokens, swa_capacity=h.aux_capacity,
                       sliding_window=h.window, page_size=cfg.page_size, record=True,
                       host_capacity=host, swa_host_capacity=h.aux_host if host else 0,
                       load_back_threshold=cfg.load_back_threshold,
                       write_policy=cfg.write_policy if host else "write_back",
                       host_policy=cfg.host_policy, eviction_policy=cfg.eviction_policy)

    def host_equiv(self, h, aux: int) -> int:
        """ceil(aux x SWA bytes / FULL bytes per token)."""
        return -(-aux * h.swa_bytes // (h.full_bytes or 1)) if aux else 0


class MambaKind(HybridKind):
    __slots__ = ()
    name = "mamba"
    label = "a Mamba hybrid"
    request_state = True
    host_key = "mamba_states"
    host_what = "the host Mamba state slots"
    host_off = "a host tier for host states"
    device_keys = ("mamba_full_memory_ratio", "max_mamba_cache_size")
    threshold_why = "SGLang's threshold never refuses a Mamba load-back: each carries a state"

    def build(self, h, cfg):
        from sim.tree.components.mamba import MambaTree

        ps = cfg.page_size
        host = h.host_tokens if h.host_tokens else None
        return MambaTree(device_capacity=cfg.device_tokens, mamba_capacity=h.aux_capacity,
                         mamba_chunk=h.mamba_chunk, page_size=ps,
                         max_states=h.max_states, extra_buffer=ps != 1,
                         record=True, host_capacity=host,
                         mamba_host_capacity=h.aux_host if host else 0,
                         load_back_threshold=cfg.load_back_threshold,
                         write_policy=cfg.write_policy if host else "write_back",
                         host_policy=cfg.host_policy, eviction_policy=cfg.eviction_policy)

    def host_equiv(self, h, aux: int) -> int:
        """``aux`` states of ``state_tokens`` each."""
        return aux * h.state_tokens


HYBRID_KINDS: dict[str, HybridKind] = {k.name: k for k in (SWAKind(), MambaKind())}
