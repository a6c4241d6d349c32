#!/usr/bin/env python3
"""SGLang's real tree core with (FULL, SWA) or (FULL, MAMBA) components, driven by
a hybrid op-trace (docs/HYBRID.md §6).

Usage (in the oracle venv):

    $SGLANG_ORACLE_VENV/bin/python tools/sglang_oracle/oracle_hybrid.py TRACE.jsonl \
        [-o OUT.jsonl] [--check]

The tree core is SGLang 0.5.23's own ``UnifiedTreeCore`` with its own
``FullComponent``, ``SWAComponent`` and ``MambaComponent`` (components/*.py),
unmodified. This file supplies only what ``UnifiedRadixCache`` and the memory pools
supply around them, on CPU:

* an SWA allocator (``FakeSWAAllocator``): full and SWA pools in pages, the
  full->SWA index mapping with 0 meaning "no SWA peer", and the
  ``free_segment`` / ``free_full_segment`` / ``free_swa_segment`` contracts of
  allocator/swa.py ``SWATokenToKVPoolAllocator``, strict about double frees;
* a Mamba state pool (``FakeHybridReqPool``) standing in for
  ``HybridReqToTokenPool.mamba_allocator``;
* the cache's action routing (``UnifiedRadixCache._apply_cache_action``), its
  eviction driver (``_evict_components`` with ``available_size_targets=None``,
  i.e. ``UnifiedRadixCache.evict``), and the request-side steps of
  ``checkpoint``: fresh KV past ``prev``, SWA freed below ``swa_evicted``, a
  forked Mamba slot freed when the tree already had one (``mamba_exist``).

With ``"hicache": true`` (``HostHybridOracle``) the core runs with its host tier:
(FULL, MAMBA) and (FULL, SWA), under every write policy. The shared oracle folder
is found as in oracle_v2.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from array import array
from pathlib import Path
from types import SimpleNamespace

ORACLE_ENV = "HICACHE_SGLANG_ORACLE"
REPO = Path(__file__).resolve().parents[2]
ORACLE_DIR = Path(os.environ.get(ORACLE_ENV) or REPO.parent / "shared" / "oracle")
if not (ORACLE_DIR / "oracle.py").is_file():
    raise SystemExit(f"{ORACLE_DIR}: found no oracle.py; expected the shared oracle's "
                     f"folder (set ${ORACLE_ENV})")
sys.path.insert(0, str(ORACLE_DIR))

import sglenv  # noqa: E402,F401  (must precede sglang imports)
import torch  # noqa: E402
from numpy import float64  # noqa: E402
from oracle import OpError  # noqa: E402
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.cache_action import (  # noqa: E402
    BackupKV,
    ComponentAction,
    FreeComponentDeviceSlot,
    FreeDeviceKV,
    FreeDeviceKVFullOnly,
    UpdatePendingBackupOnNodeSplit,
)
from sglang.srt.mem_cache.unified_cache.components import base as comp_base  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components import mamba as mamba_mod  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import (  # noqa: E402
    ComponentType,
    EvictLayer,
)
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.mamba import MambaComponent  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.swa import SWAComponent  # noqa: E402
from sglang.srt.mem_cache.unified_cache.unified_tree_core import (  # noqa: E402
    UnifiedTreeCore,
    UnifiedTreeNode,
)

WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
FULL, SWA, MAMBA = ComponentType.FULL, ComponentType.SWA, ComponentType.MAMBA
CT_NAME = {FULL: "full", SWA: "swa", MAMBA: "mamba"}
UUID_START = dict(comp_base._COMPONENT_UUID_COUNTERS)  # process-global: reset per trace


# ---------------------------------------------------------------------------
# Pools


class PagePool:
    """Pages 1..n (page 0 is the padding page, never handed out). Lowest first."""

    def __init__(self, name: str, pages: int, page_size: int):
        self.name, self.ps = name, page_size
        self.pages = pages
        self._free = list(range(pages, 0, -1))
        self._used = bytearray(pages + 1)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_tokens(self) -> int:
        return (self.pages - len(self._free)) * self.ps

    def alloc_pages(self, n: int) -> list[int]:
        assert n <= len(self._free), f"{self.name}: out of pages"
        out = [self._free.pop() for _ in range(n)]
        for p in out:
            self._used[p] = 1
        return out

    def free_page(self, p: int) -> None:
        assert self._used[p], f"{self.name} pool: double free of page {p}"
        self._used[p] = 0
        self._free.append(p)


class _FullSide:
    """``alloc.full_attn_allocator``: FullComponent frees through it directly."""

    def __init__(self, owner):
        self.owner = owner

    def free_segment(self, idx, start_pos=0):
        self.owner._free_full_pages(idx)


class FakeSWAAllocator(SWATokenToKVPoolAllocator):
    """The static SWA allocator's tree-facing contract (allocator/swa.py), on CPU."""

    def __init__(self, full_pages: int, swa_pages: int, page_size: int):  # noqa: D107
        self.page_size = page_size
        self.full = PagePool("full", full_pages, page_size)
        self.swa = PagePool("swa", swa_pages, page_size)
        self.full_to_swa_index_mapping = torch.zeros((full_pages + 1) * page_size,
                                                     dtype=torch.int64)
        self.full_attn_allocator = _FullSide(self)
        self.device = torch.device("cpu")

    def _tokens(self, pages):
        ps = self.page_size
        return [p * ps + o for p in pages for o in range(ps)]

    def alloc_request(self, n_full: int, n_swa_tail: int) -> torch.Tensor:
        """Fresh full KV for n_full tokens; the last n_swa_tail also get SWA peers."""
        ps = self.page_size
        full = self._tokens(self.full.alloc_pages(n_full // ps))
        if n_swa_tail:
            swa = self._tokens(self.swa.alloc_pages(n_swa_tail // ps))
            self.full_to_swa_index_mapping[torch.tensor(full[len(full) - n_swa_tail:])] = \
                torch.tensor(swa)
        return torch.tensor(full, dtype=torch.int64)

    def translate_swa_indices_for_transfer(self, kv_indices):
        return self.full_to_swa_index_mapping[kv_indices.to(torch.int64)].clone()

    def set_full_to_swa_mapping(self, full_indices, swa_indices):
        if full_indices.numel():
            self.full_to_swa_index_mapping[full_indices.to(torch.int64)] = swa_indices

    def clear_full_to_swa_mapping(self, full_indices):
        if full_indices.numel():
            self.full_to_swa_index_mapping[full_indices.to(torch.int64)] = 0

    def _free_full_pages(self, idx):
        ps = self.page_size
        for t in idx[::ps].tolist():
            assert t % ps == 0, f"full segment not page-aligned at {t}"
            self.full.free_page(t // ps)

    def free_swa_segment(self, free_index, *, start_pos=0):
        ps = self.page_size
        if free_index.numel() == 0:
            return
        reps = free_index[::ps]
        swa_tokens = self.full_to_swa_index_mapping[reps]
        assert bool((swa_tokens > 0).all()), f"free_swa of unmapped full slots {reps.tolist()}"
        pages = (swa_tokens // ps).tolist()
        for r in reps.tolist():
            self.full_to_swa_index_mapping[r:r + ps] = 0
        for p in pages:
            self.swa.free_page(p)

    def free_segment(self, free_index, *, start_pos=0):
        if free_index.numel() == 0:
            return
        self.free_swa_segment(free_index)
        self._free_full_pages(free_index)

    def free_full_segment(self, free_index, *, start_pos=0):
        if free_index.numel() == 0:
            return
        assert bool((self.full_to_swa_index_mapping[free_index] == 0).all()), \
            "free_full_segment of slots that still have SWA peers"
        self._free_full_pages(free_index)


class FakeFullAllocator:
    """Plain full KV allocator for the (FULL, MAMBA) tree."""

    def __init__(self, pages: int, page_size: int):
        self.page_size = page_size
        self.full = PagePool("full", pages, page_size)
        self.device = torch.device("cpu")

    def alloc_request(self, n_full: int, n_swa_tail: int = 0) -> torch.Tensor:
        ps = self.page_size
        pages = self.full.alloc_pages(n_full // ps)
        return torch.tensor([p * ps + o for p in pages for o in range(ps)], dtype=torch.int64)

    def free_segment(self, idx, *, start_pos=0):
        ps = self.page_size
        for t in idx[::ps].tolist():
            self.full.free_page(t // ps)


class FakeMambaAllocator:
    def __init__(self, n: int):
        self.pool = PagePool("mamba", n, 1)

    def alloc(self, n: int):
        if n > self.pool.free_pages:
            return None
        return torch.tensor(self.pool.alloc_pages(n), dtype=torch.int64)

    def free(self, t):
        for i in t.reshape(-1).tolist():
            self.pool.free_page(i)


class FakeHybridReqPool(HybridReqToTokenPool):
    def __init__(self, n: int):  # noqa: D107
        self.mamba_allocator = FakeMambaAllocator(n)


# ---------------------------------------------------------------------------
# The core, with observing hooks


class TracedCore(UnifiedTreeCore):
    def reset(self) -> None:
        self.events: list[dict] = []
        super().reset()

    def path(self, node) -> list[int]:
        parts = []
        while node is not None and node is not self.root_node:
            parts.append(node.key.raw_token_ids())
            node = node.parent
        return [t for p in reversed(parts) for t in p]

    def _ev(self, kind, node, **kw):
        self.events.append({"k": kind, "id": node.id, **kw})

    def _split_node(self, key, child, split_len):
        new_node, action = super()._split_node(key, child, split_len)
        self._ev("split", new_node, child=child.id, n=len(new_node.key))
        return new_node, action

    def _add_new_node(self, parent, key, value, *a, **kw):
        node = super()._add_new_node(parent, key, value, *a, **kw)
        self._ev("new", node, n=len(node.key))
        return node

    def _remove_leaf_from_parent(self, node):
        self._ev("delete", node, n=len(node.key))
        super()._remove_leaf_from_parent(node)

    def _evict_component_and_detach_lru(self, node, comp, *a, target=EvictLayer.DEVICE,
                                        **kw):
        ct = comp.component_type
        had = node.component_data[ct].value is not None
        n = comp.value_len(node)
        host_value = node.component_data[ct].host_value
        had_host = host_value is not None
        n_host = 0 if host_value is None else len(host_value)
        out = super()._evict_component_and_detach_lru(node, comp, *a, target=target, **kw)
        if ct is not FULL and target is EvictLayer.DEVICE and had:
            self._ev("tomb", node, c=CT_NAME[ct], n=n)
        elif ct is not FULL and target is EvictLayer.HOST and had_host:
            self._ev("host_tomb", node, c=CT_NAME[ct], n=n_host)
        return out

    def set_component_device_value(self, node_id, component_type, value):
        super().set_component_device_value(node_id, component_type, value)
        self._ev("set", self.node_by_id(node_id), c=CT_NAME[component_type], n=len(value))

    # -- host tier (HiCache on): the hooks below fire only on host paths ------

    def _demote(self, node, *a, **kw):
        self._ev("demote", node, n=len(node.component_data[FULL].value))
        super()._demote(node, *a, **kw)

    def _unevict_node_on_insert(self, node, fresh_value, *a, **kw):
        super()._unevict_node_on_insert(node, fresh_value, *a, **kw)
        self._ev("unevict", node, n=len(fresh_value))

    def _release_full_host_duplicate(self, node, *a, **kw):
        pass_no = 2 if node in self.evictable_device_leaves else 1
        self._ev("dup_reclaim", node, n=len(node.component_data[FULL].host_value),
                 **{"pass": pass_no})
        super()._release_full_host_duplicate(node, *a, **kw)

    def _reclaim_full_host_duplicates(self, *a, **kw):
        before = list(self.full_host_duplicates.items())
        n_events = len(self.events)
        super()._reclaim_full_host_duplicates(*a, **kw)
        released = {e["id"] for e in self.events[n_events:] if e["k"] == "dup_reclaim"}
        for nid, node in before:  # stale entries the walk swept, in map order
            if nid not in self.full_host_duplicates and nid not in released:
                self._ev("dup_sweep", node)


class TracedMamba(MambaComponent):
    def commit_insert_component_data(self, node, is_new_leaf, params, result, cache_actions):
        super().commit_insert_component_data(node, is_new_leaf, params, result, cache_actions)
        if is_new_leaf:
            self.tree_core._ev("set", node, c="mamba", n=1)

    def commit_hicache_transfer(self, node, phase, transfers=(), **kw):
        had = node.component_data[MAMBA].host_value is not None
        super().commit_hicache_transfer(node, phase, transfers, **kw)
        if not had and node.component_data[MAMBA].host_value is not None:
            self.tree_core._ev("host_set", node, c="mamba", n=1)


class TracedSWA(SWAComponent):
    def commit_hicache_transfer(self, node, phase, transfers=(), **kw):
        nodes = []
        if transfers and transfers[0].nodes_to_load:
            nodes = [self.tree_core.node_by_id(n) for n in transfers[0].nodes_to_load]
        had = [n.component_data[SWA].host_value is not None for n in nodes]
        super().commit_hicache_transfer(node, phase, transfers, **kw)
        for n, h in zip(nodes, had):  # the window's backups, oldest first
            if not h and n.component_data[SWA].host_value is not None:
                self.tree_core._ev("host_set", n, c="swa", n=len(n.key))


def build(header: dict):
    kind = header_kind(header)
    ps = int(header.get("page_size", 1))
    cache = SimpleNamespace(enable_session_radix_cache=False, is_swa_enabled=kind == "swa")
    if kind == "swa":
        alloc = FakeSWAAllocator(int(header["device_capacity"]) // ps,
                                 int(header["swa_capacity"]) // ps, ps)
        req_pool = None
    else:
        alloc = FakeFullAllocator(int(header["device_capacity"]) // ps, ps)
        req_pool = FakeHybridReqPool(int(header["mamba_capacity"]))
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=req_pool,
        token_to_kv_pool_allocator=alloc,
        page_size=ps,
        tree_components=(FULL, SWA if kind == "swa" else MAMBA),
        eviction_policy="lru",
        sliding_window_size=int(header["sliding_window"]) if kind == "swa" else None,
        enable_mamba_extra_buffer=bool(header.get("mamba_extra_buffer", False)),
    )
    cache.token_to_kv_pool_allocator = alloc
    cache.req_to_token_pool = req_pool
    cache.page_size = ps
    UnifiedTreeNode.counter = 0
    comp_base._LAST_ACCESS_TIME_COUNTER_FLOAT = float64(1.0)
    comp_base._COMPONENT_UUID_COUNTERS.update(UUID_START)
    if kind == "swa":
        aux = TracedSWA(cache, params)
    else:
        chunk = int(header["mamba_chunk"])
        cap = int(header.get("mamba_max_states", -1))
        saved = (mamba_mod.mamba_cache_chunk_size, mamba_mod.mamba_checkpoint_grid,
                 mamba_mod.get_exec)
        import math
        mamba_mod.mamba_cache_chunk_size = lambda: chunk
        mamba_mod.mamba_checkpoint_grid = lambda page: math.lcm(chunk, page)
        mamba_mod.get_exec = lambda: SimpleNamespace(
            mamba=SimpleNamespace(mamba_max_states_per_path=cap,
                                  enable_mamba_extra_buffer_lazy=False))
        try:
            aux = TracedMamba(cache, params)
        finally:
            (mamba_mod.mamba_cache_chunk_size, mamba_mod.mamba_checkpoint_grid,
             mamba_mod.get_exec) = saved
    full = FullComponent(cache, params)
    comps = {FULL: full, aux.component_type: aux}
    core = TracedCore(params, comps)
    # As oracle.py: the LRU sentinels (ids 1..8 for two components) leave the id
    # space; the first tree node is 1.
    sid = -1
    for lru in (*core.lru_lists.values(), *core.host_lru_lists.values()):
        for s in (lru.head, lru.tail, lru.mid, lru.cursor):
            if s is not None:
                s.id, sid = sid, sid - 1
    UnifiedTreeNode.counter = 1
    cache.components = comps
    cache.tree_components = tuple(comps)
    if header.get("hicache") is True:
        # As oracle.py build_core for write_back: init_hicache's settings.
        core.set_hicache_enabled()
        core.is_write_back = True
        core.write_through_threshold = 2
    return kind, core, alloc, req_pool, comps


def header_kind(header: dict) -> str:
    comps = header.get("components")
    if comps == ["full", "swa"]:
        return "swa"
    if comps == ["full", "mamba"]:
        return "mamba"
    raise ValueError(f"unsupported components {comps!r}")


class HybridOracle:
    def __init__(self, header: dict):
        self.kind, self.core, self.alloc, self.req_pool, self.comps = build(header)
        self.ps = int(header.get("page_size", 1))
        self.aux = SWA if self.kind == "swa" else MAMBA
        self.cache = self.comps[FULL].cache
        self.cache._apply_eviction_result = self._drain
        # What finalize_match_result_in_cache (Mamba's copy on write) calls on the cache.
        self.cache.inc_lock_ref = self.core.inc_lock_ref
        self.cache.dec_lock_ref = self.core.dec_lock_ref
        self.cache.evict_for_alloc = self.evict_for_alloc
        self.locks: dict = {}
        self.held: dict = {}  # request id -> its own Mamba state slot (a 1-slot tensor)
        # KV running requests hold outside the tree (an engine trace's "reserved" and
        # "swa_reserved", docs/HYBRID.md §10.5): pages taken from the pools, one page
        # per entry, FULL pages with an SWA peer and FULL pages without.
        self._res_swa: list = []
        self._res_full: list = []
        self._res_swa_only: list = []

    # -- plumbing ------------------------------------------------------------

    def key(self, tokens) -> RadixKey:
        return RadixKey(array("q", tokens)).page_aligned(self.ps)

    def _apply(self, actions) -> None:
        actions.reverse()
        while actions:
            a = actions.pop()
            if isinstance(a, UpdatePendingBackupOnNodeSplit) and a.ack_id is not None:
                # _apply_cache_action: the write's publish list takes both fragments.
                self._replace_pending_write(a.ack_id, a.old_node_id,
                                            [a.new_node_id, a.new_child_node_id])
            if isinstance(a, BackupKV):
                # _apply_cache_action: an insert's write_through backup chain.
                self._backup(a.node_ids, write_back=False)
            elif isinstance(a, ComponentAction):
                self.comps[a.component_type].apply_component_action(a)
            elif isinstance(a, FreeDeviceKV):
                for t in a.indices:
                    self.alloc.free_segment(t, start_pos=0)
            elif isinstance(a, FreeDeviceKVFullOnly):
                for t in a.indices:
                    self.alloc.free_full_segment(t, start_pos=0)
            else:
                raise AssertionError(f"unhandled action {type(a).__name__}")

    def _replace_pending_write(self, ack_id, old, new) -> None:
        raise AssertionError("a pending write with the host tier off")

    def _backup(self, node_ids, write_back: bool = True) -> int:
        raise AssertionError("a backup with the host tier off")

    def _drain(self, result) -> None:
        """UnifiedRadixCache._apply_eviction_result."""
        for ct in list(result.device_frees):
            self.comps[ct].apply_component_action(
                FreeComponentDeviceSlot(result.device_frees.pop(ct), component_type=ct))
        assert not any(result.host_frees.values())
        self._apply(result.cache_actions)

    def _device_path_values(self, key: RadixKey, upto: int):
        """FULL indices of the tree's first ``upto`` tokens along key (read-only).

        ``upto`` must end at a node boundary: a request's reused prefix is what its
        match returned, which ends at a node (the match splits there), and its lock
        keeps that node. SGLang's insert relies on it: a tombstone straddling
        ``prev_prefix_len`` would be revived from the tree's own ids as if they were
        the request's (swa.py ``_recover_from_incoming``)."""
        node, vals, got = self.core.root_node, [], 0
        while got < upto:
            child = node.children.get(key[got:].child_key(self.ps))
            if child is None:
                break
            m = child.key.match(key[got:], page_size=self.ps)
            if m < len(child.key) or got + m > upto:
                break
            vals.append(child.component_data[FULL].value)
            got += m
            node = child
        if got != upto:
            raise OpError("bad_prev")
        return torch.cat(vals) if vals else torch.empty((0,), dtype=torch.int64)

    def _reserve(self, op) -> None:
        """Hold ``reserved`` FULL tokens and ``swa_reserved`` SWA tokens out of the
        pools for this op, as the requests that own them do: FULL pages with an SWA
        peer, FULL pages without, SWA pages alone (the SWA a batch took before its
        FULL), shrunk first so the pools never run dry in between."""
        ps = self.ps
        full = int(op.get("reserved", 0)) // ps
        swa = int(op.get("swa_reserved", 0)) // ps if self.kind == "swa" else 0
        paired = min(full, swa)
        want = {"paired": paired, "full": full - paired, "swa": swa - paired}
        stacks = {"paired": self._res_swa, "full": self._res_full, "swa": self._res_swa_only}
        for name, stack in stacks.items():
            while len(stack) > want[name]:
                t = stack.pop()
                if name == "paired" or self.kind != "swa":
                    self.alloc.free_segment(t)
                elif name == "full":
                    self.alloc.free_full_segment(t)
                else:
                    self.alloc.swa.free_page(t)
        for name, stack in stacks.items():
            while len(stack) < want[name]:
                if name == "swa":
                    stack.append(self.alloc.swa.alloc_pages(1)[0])
                else:
                    stack.append(self.alloc.alloc_request(ps, ps if name == "paired" else 0))

    def _reserved_tokens(self) -> tuple[int, int]:
        ps = self.ps
        return ((len(self._res_swa) + len(self._res_full)) * ps,
                (len(self._res_swa) + len(self._res_swa_only)) * ps)

    # -- ops -----------------------------------------------------------------

    def op_insert(self, op):
        if "donate" in op and (self.kind != "mamba" or op["donate"] not in self.held):
            raise OpError("unknown_request")
        key = self.key(op["tokens"])
        n = len(key)
        prev = int(op.get("prev", 0))
        if prev % self.ps or prev > n:
            raise OpError("bad_prev")
        prefix = self._device_path_values(key, prev)
        need = n - prev
        if need > self.alloc.full.free_pages * self.ps:
            raise OpError("device_full")
        params = InsertParams(key=key, prev_prefix_len=prev,
                              inserted_len=int(op.get("inserted", 0)))
        if self.kind == "swa":
            evicted = int(op.get("swa_evicted", 0))
            if evicted % self.ps:
                raise OpError("bad_swa_evicted")
            swa_need = max(0, n - max(prev, evicted))
            if swa_need > self.alloc.swa.free_pages * self.ps:
                raise OpError("swa_full")
            params.set_evicted_seqlen(SWA, evicted)
            fresh = self.alloc.alloc_request(need, swa_need)
        elif "donate" in op:
            # A finished request hands the tree its own state (prepare_for_caching_req
            # with is_finished): the slot it copied into at match.
            mamba_slot = self.held.pop(op["donate"])
            params.mamba_value = mamba_slot
            fresh = self.alloc.alloc_request(need)
        else:
            mamba_slot = self.req_pool.mamba_allocator.alloc(1)
            if mamba_slot is None:
                raise OpError("mamba_full")
            params.mamba_value = mamba_slot
            fresh = self.alloc.alloc_request(need)
        params.value = torch.cat([prefix, fresh])
        step = self.core.begin_insert(params)
        while True:
            self._apply(step.actions)
            if step.result is not None:
                break
            step = self.core.resume_insert()
        self._apply(self.core.end_insert())
        res = step.result
        out = {"prefix_len": res.prefix_len, "new": need}
        if self.kind == "swa":
            out["swa_new"] = swa_need
        else:
            out["mamba_exist"] = bool(res.mamba_exist)
            if res.mamba_exist:  # cleanup_after_caching_req frees the forked slot
                self.req_pool.mamba_allocator.free(mamba_slot)
        out["node"] = res.last_device_node
        return out

    def _match(self, tokens):
        r = self.core.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))
        self._apply(list(r.cache_actions))
        out = {"device_len": r.device_prefix_len, "full_len": r.full_kv_hit_length,
               "node": r.best_match_node}
        br = r.swa_branching_seqlen if self.kind == "swa" else r.mamba_branching_seqlen
        out["branch"] = br
        out.update(self._host_fields(r))
        return r, out

    def _host_fields(self, r) -> dict:
        """Host-tier match fields (none with HiCache off)."""
        return {}

    def _peek_mamba_best(self, tokens):
        """The node a match of tokens would end at (Mamba: the deepest wholly matched
        node holding a state; a split-off fragment never holds one), read-only."""
        key, node, best = self.key(tokens), self.core.root_node, self.core.root_node
        while len(key) > 0:
            child = node.children.get(key.child_key(self.ps))
            if child is None:
                break
            m = child.key.match(key, page_size=self.ps)
            if m < len(child.key):
                break
            if child.component_data[MAMBA].value is not None:
                best = child
            node, key = child, key[m:]
        return best

    def op_match(self, op):
        if "cow" not in op:
            return self._match(op["tokens"])[1]
        return self._match_cow(op)[1]

    def _match_cow(self, op):
        """``match_prefix(cow_mamba=True)``: the match, then the components'
        ``finalize_match_result_in_cache`` (Mamba's copy on write)."""
        if self.kind != "mamba":
            raise OpError("no_mamba_component")
        rid = op["cow"]
        holds = rid in self.held
        if not holds and self.req_pool.mamba_allocator.pool.free_pages == 0:
            # finalize_match_result_in_cache asserts "Can not alloc mamba cache" when
            # evicting one state under a lock on the match frees none: refuse first.
            best = self._peek_mamba_best(op["tokens"])
            cd = best.component_data[MAMBA]
            if cd.value is not None:
                others = self.core.component_evictable_size_[MAMBA] - (cd.lock_ref == 0)
                if others <= 0:
                    raise OpError("mamba_full")
        req = SimpleNamespace(kv=SimpleNamespace(holds_mamba=holds, mamba_pool_idx=None,
                                                 mamba_cow_src_index=None,
                                                 mamba_needs_clear=True))
        params = MatchPrefixParams(key=RadixKey(array("q", op["tokens"])), cow_mamba=True,
                                   req=req)
        r = self.core.match_prefix(params)
        self._apply(r.cache_actions)
        for comp in (self.comps[FULL], self.comps[MAMBA]):  # UnifiedRadixCache order
            r = comp.finalize_match_result_in_cache(params, r)
        if req.kv.mamba_pool_idx is not None:
            self.held[rid] = req.kv.mamba_pool_idx.reshape(1)
        return r, {"device_len": r.device_prefix_len, "full_len": r.full_kv_hit_length,
                   "node": r.best_match_node, "branch": r.mamba_branching_seqlen,
                   **self._host_fields(r), "cow": req.kv.mamba_cow_src_index is not None}

    def op_release(self, op):
        """A request that leaves without caching frees its own state slot."""
        if op["id"] not in self.held:
            raise OpError("unknown_request")
        self.req_pool.mamba_allocator.free(self.held.pop(op["id"]))
        return {}

    def op_lock(self, op):
        lid = op["id"]
        if lid in self.locks:
            raise OpError("duplicate_lock_id")
        if op.get("exact"):
            # the node whose path is exactly tokens (an insert's last_device_node, a
            # load-back's anchor: UnifiedRadixCache.lock on a node id, no match)
            node_id = self._node_at(op["tokens"])
            skip = tuple(MAMBA for c in op.get("skip", ()) if c == "mamba")
            receipt = self.core.inc_lock_ref(node_id, skip_lock_components=skip).to_dec_params()
            self.locks[lid] = [node_id, receipt, False]
            return {"node": node_id}
        r, out = self._match_cow(op) if "cow" in op else self._match(op["tokens"])
        node_id = r.last_device_node
        # skip ["mamba"]: the decode hold under SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK
        # (UnifiedRadixCache.checkpoint: lock(..., skip_lock_components=(MAMBA,))).
        skip = tuple(MAMBA for c in op.get("skip", ()) if c == "mamba")
        receipt = self.core.inc_lock_ref(node_id, skip_lock_components=skip).to_dec_params()
        self.locks[lid] = [node_id, receipt, False]
        return out

    def _node_at(self, tokens):
        key, node = self.key(tokens), self.core.root_node
        while len(key) > 0:
            child = node.children.get(key.child_key(self.ps))
            if child is None or child.key.match(key, page_size=self.ps) < len(child.key):
                raise OpError("unknown_node")
            node, key = child, key[len(child.key):]
        return node.id

    def op_alloc(self, op):
        """``alloc_req_slots``: a request takes a fresh Mamba state slot."""
        if self.kind != "mamba":
            raise OpError("no_mamba_component")
        rid = op["id"]
        if rid in self.held:
            raise OpError("duplicate_request")
        slot = self.req_pool.mamba_allocator.alloc(1)
        if slot is None:
            raise OpError("mamba_full")
        self.held[rid] = slot
        return {}

    def op_skip_ids(self, op):
        UnifiedTreeNode.counter += int(op["n"])
        return {}

    def op_unlock(self, op):
        lid = op["id"]
        if lid not in self.locks:
            raise OpError("unknown_lock_id")
        node_id, receipt, swa_released = self.locks.pop(lid)
        self.core.dec_lock_ref(node_id, receipt, skip_swa=swa_released)
        return {}

    def op_release_swa(self, op):
        """UnifiedRadixCache.release_swa: the SWA part of a lock, early, once."""
        lid = op["id"]
        if self.kind != "swa":
            raise OpError("no_swa_component")
        if lid not in self.locks:
            raise OpError("unknown_lock_id")
        entry = self.locks[lid]
        if entry[2]:
            raise OpError("swa_already_released")
        result = self.core.dec_swa_lock_only(entry[0], entry[1])
        self._drain(result)
        entry[2] = True
        return {}

    def _available(self, ct) -> int:
        """cache ``_component_available_size``: the pool's free room."""
        if ct is FULL:
            return self.alloc.full.free_pages * self.ps
        if ct is SWA:
            return self.alloc.swa.free_pages * self.ps
        return self.req_pool.mamba_allocator.pool.free_pages

    def _evict(self, request: dict, targets: dict | None = None) -> dict:
        """cache ``_evict`` -> ``_evict_components``; ``targets`` as
        ``evict_for_alloc`` builds them ({ct: available + request})."""
        core = self.core
        tracker = {FULL: 0, self.aux: 0}

        def target_reached(ct):
            if targets is None or ct not in targets:
                return False
            return self._available(ct) >= targets[ct]

        for ct in (FULL, self.aux):
            request_cnt = request[ct]
            to_target = ct is FULL and request_cnt > 0 and targets is not None and ct in targets
            if target_reached(ct) or (not to_target and tracker[ct] >= request_cnt):
                continue
            quota = request_cnt
            if to_target:
                quota = max(request_cnt, tracker[ct] + core.full_evictable_size())
            core.evict_device_start(ct, quota)
            try:
                while True:
                    step = core.evict_device_next_node(ct, tracker)
                    assert step.mamba_backup_node_id is None and step.swa_backup_node_id is None
                    node_id = step.node_id
                    self._drain(step)
                    for c, k in step.tracker.items():
                        tracker[c] += k
                    if node_id is None:
                        if not step.made_progress:
                            break
                    else:
                        leaf = core.evict_device_leaf(node_id, False)
                        assert leaf.backup_kv is None
                        self._drain(leaf)
                        for c, k in leaf.tracker.items():
                            tracker[c] += k
                    if target_reached(ct):
                        break
            finally:
                core.evict_device_end(ct)
        return tracker

    def _request(self, op) -> dict:
        return {FULL: int(op.get("full", 0)), self.aux: int(op.get(CT_NAME[self.aux], 0))}

    def op_evict(self, op):
        """UnifiedRadixCache.evict: _evict_components(available_size_targets=None)."""
        tracker = self._evict(self._request(op))
        return {"freed": {CT_NAME[c]: tracker[c] for c in (FULL, self.aux)}}

    def evict_for_alloc(self, params) -> None:
        """UnifiedRadixCache.evict_for_alloc (component shortfalls, no joint-reclaim
        predicate, no Mamba full-cache donor in these pools)."""
        request = {FULL: params.num_tokens,
                   SWA: params.swa_num_tokens, MAMBA: params.mamba_num}
        request = {FULL: request[FULL], self.aux: request[self.aux]}
        targets = {ct: self._available(ct) + n for ct, n in request.items() if n > 0}
        return self._evict(request, targets)

    def op_evict_for_alloc(self, op):
        r = self._request(op)
        tracker = self.evict_for_alloc(EvictParams(
            num_tokens=r[FULL], swa_num_tokens=r.get(SWA, 0), mamba_num=r.get(MAMBA, 0)))
        return {"freed": {CT_NAME[c]: tracker[c] for c in (FULL, self.aux)}}

    def op_dump(self, op):
        core, aux = self.core, self.aux
        nodes = [n for n in core._node_arena.values() if n is not core.root_node]
        rank = {n.id: r for r, n in enumerate(sorted(nodes, key=lambda n: n.last_access_time))}
        lru, order, x = core.lru_lists[aux], [], None
        pt = lru._pt
        x = lru.head.lru_next[pt]
        while x is not lru.tail:
            order.append(x.id)
            x = x.lru_next[pt]
        tree, stack = [], [(core.root_node, 0)]
        while stack:
            node, start = stack.pop()
            if node is not core.root_node:
                f, a = node.component_data[FULL], node.component_data[aux]
                tree.append({
                    "id": node.id, "parent": node.parent.id, "start": start,
                    "key": list(node.key.raw_token_ids()),
                    "lock": f.lock_ref, CT_NAME[aux]: a.value is not None,
                    CT_NAME[aux] + "_lock": a.lock_ref, "recency": rank[node.id],
                })
                start += len(node.key)
            kids = sorted(node.children.values(), key=lambda c: list(c.key.raw_token_ids()))
            stack.extend((c, start) for c in reversed(kids))
        return {"tree": tree, "lru": order,
                "d_leaves": sorted(n.id for n in core.evictable_device_leaves)}

    OPS = {"insert": op_insert, "match": op_match, "lock": op_lock, "unlock": op_unlock,
           "release_swa": op_release_swa, "evict": op_evict,
           "evict_for_alloc": op_evict_for_alloc, "release": op_release, "dump": op_dump,
           "alloc": op_alloc, "skip_ids": op_skip_ids}

    def apply(self, op: dict) -> dict:
        name = op["op"]
        self.core.events = []
        fn = self.OPS.get(name)
        self._reserve(op)
        try:
            if fn is None:
                raise OpError(f"unknown_op {name}")
            out = {"op": name, **fn(self, op)}
        except OpError as e:
            out = {"op": name, "error": str(e)}
        out["events"] = self.core.events
        out.update(self.summary())
        return out

    def summary(self) -> dict:
        core, aux = self.core, self.aux
        a = CT_NAME[aux]
        res_full, res_swa = self._reserved_tokens()
        used = (self.alloc.swa.used_tokens - res_swa if aux is SWA
                else self.req_pool.mamba_allocator.pool.used_tokens)
        out = {
            "dev": self.alloc.full.used_tokens - res_full, a: used,
            "evictable": core.component_evictable_size_[FULL],
            "protected": core.component_protected_size_[FULL],
            a + "_evictable": core.component_evictable_size_[aux],
            a + "_protected": core.component_protected_size_[aux],
            "nodes": len(core._node_arena) - 1,
        }
        if aux is MAMBA:
            out["mamba_held"] = len(self.held)
        return out

    def check(self) -> None:
        core, aux = self.core, self.aux
        core.sanity_check([], [])
        dev = a = 0
        for n in core._node_arena.values():
            if n is core.root_node:
                continue
            dev += len(n.component_data[FULL].value)
            v = n.component_data[aux].value
            a += 0 if v is None else len(v)
        res_full, res_swa = self._reserved_tokens()
        assert dev == self.alloc.full.used_tokens - res_full, (dev, self.alloc.full.used_tokens)
        used = (self.alloc.swa.used_tokens - res_swa if aux is SWA
                else self.req_pool.mamba_allocator.pool.used_tokens)
        if aux is MAMBA:
            used -= len(self.held)
        assert a == used, (a, used)
        assert core.component_evictable_size_[FULL] + core.component_protected_size_[FULL] == dev
        assert core.component_evictable_size_[aux] + core.component_protected_size_[aux] == a


# ---------------------------------------------------------------------------
# The host tier (HiCache on, write_back): docs/HYBRID.md §5


class HostHybridOracle(HybridOracle):
    """A hybrid trace with ``"hicache": true``: SGLang's core with HiCache enabled
    under write_back (``set_hicache_enabled``, ``is_write_back``), FULL and
    component host pools, and what ``UnifiedRadixCache`` does around the core on
    the host paths: ``_evict_components``' write_back branches (the leaf backup and
    demote, the drop fallback, a Mamba ``InternalStateBackup``: host room, then
    ``backup_node_for_write_back``, then ``finish_mamba_state_eviction``),
    ``_execute_and_commit_kv_backup`` with its host allocations
    (``HybridCacheController.allocate_host_transfers``: FULL first, then each side
    pool, reclaiming that pool's host once, all or nothing), the blocking
    ``writing_check(write_back=True)``, ``evict_host`` (``drive_host_eviction``),
    and ``load_back`` / ``loading_check`` (with a request for Mamba's
    ``prepare_load_back``). Under a write_through ``write_policy`` (docs/HYBRID.md
    §5.9): ``is_write_back`` False, ``write_through_threshold`` 1 or 2, the insert's
    ``BackupKV`` actions run as ``_apply_cache_action`` runs them (each written node
    locked until its ack), ``UpdatePendingBackupOnNodeSplit`` relocating a write's
    publish list, and ``write_ack`` ops as ``_finish_write_through_ack``. (FULL, SWA)
    (docs/HYBRID.md §5.8): an SWA host pool (``has_swa_host_pool``), the window
    backups of ``_collect_unbacked_swa_nodes_in_window``, an SWA
    ``InternalStateBackup`` (``evict_host(needed, SWA)``, the backup,
    ``finish_swa_state_eviction``), the SWA device slots of a load-back
    (``_resolve_device_transfers`` with ``_evict_swa_for_device_alloc``) and the
    full->SWA mapping rebuild (``RebuildFullToSWAMapping``)."""

    def __init__(self, header: dict):
        super().__init__(header)
        policy = header.get("write_policy", "write_back")
        if policy not in WRITE_POLICIES:
            raise SystemExit(f"hicache: write_policy {policy!r} is not one of "
                             f"{', '.join(WRITE_POLICIES)}")
        # init_hicache / storage_attachment: write_through_threshold 1 for
        # write_through, 2 otherwise (write_through_selective; unused by write_back).
        self.wt = policy != "write_back"
        self.core.is_write_back = not self.wt
        self.core.write_through_threshold = 1 if policy == "write_through" else 2
        ps = self.ps
        self.host = PagePool("host", int(header["host_capacity"]) // ps, ps)
        if self.kind == "swa":
            # hybrid_pool_assembler build_hybrid_swa_group: an SWA host pool in the
            # SWA pool's pages; UnifiedRadixCache.__init__ sets has_swa_host_pool.
            self.aux_host = PagePool("swa_host", int(header["swa_host_capacity"]) // ps, ps)
            self.core.has_swa_host_pool = True
            self.comps[SWA]._swa_kv_pool_host = SimpleNamespace(
                available_size=lambda: self.aux_host.free_pages * ps, page_size=ps)
        else:
            self.aux_host = PagePool("mamba_host", int(header["mamba_host_capacity"]), 1)
        self.mamba_host = self.aux_host
        self.load_back_threshold = int(header.get("load_back_threshold", 1))
        # ack id -> [published node ids, the backup's device lock receipt or None]
        # (UnifiedRadixCache.ongoing_write_through)
        self.writes: dict = {}
        self.load_backs: dict = {}   # trace id -> (anchor, lock receipt, host receipt)

    # -- pools --------------------------------------------------------------------

    def _host_tokens(self, pool: PagePool, n: int):
        ps = pool.ps
        if n > pool.free_pages * ps:
            return None
        pages = pool.alloc_pages(n // ps)
        return torch.tensor([p * ps + o for p in pages for o in range(ps)], dtype=torch.int64)

    def _free_host(self, pool: PagePool, t) -> None:
        ps = pool.ps
        for x in t.reshape(-1)[::ps].tolist():
            pool.free_page(x // ps)

    def _drain(self, result) -> None:
        for ct in list(result.device_frees):
            self.comps[ct].apply_component_action(
                FreeComponentDeviceSlot(result.device_frees.pop(ct), component_type=ct))
        for ct in list(result.host_frees):
            pool = self.host if ct is FULL else self.aux_host
            for t in result.host_frees.pop(ct):
                self._free_host(pool, t)
        self._apply(result.cache_actions)

    # -- backups (UnifiedRadixCache._execute_and_commit_kv_backup) ----------------

    def evict_host(self, n: int, ct=FULL) -> int:
        """UnifiedRadixCache.evict_host: drive_host_eviction, drained."""
        res = self.core.drive_host_eviction(ct, n)
        freed = res.tracker.get(ct, 0)
        self._drain(res)
        return freed

    def _backup(self, node_ids, write_back: bool = True) -> int:
        """UnifiedRadixCache._execute_and_commit_kv_backup: top-down, stopping at the
        first failed node; under write_through (``write_back`` False) each written
        node is locked on device until its ack."""
        core, written = self.core, 0
        for nid in node_ids:
            device_value, comp_xfers = core.build_backup_spec(nid)
            if device_value.numel() == 0 and not comp_xfers:
                continue
            n = len(device_value)
            # _execute_kv_backup: make FULL host room, or give up.
            avail = self.host.free_pages * self.ps
            if avail < n and self.evict_host(n - avail) < n - avail:
                return 0
            host_indices = self._host_tokens(self.host, n)
            if host_indices is None:
                return 0
            # HostPoolGroup.resolve_host_transfers: side pools by name, each
            # alloc reclaiming its own host once (host_mamba_evict_fn), atomic.
            allocated = []
            failed = False
            for t in sorted((t for ts in comp_xfers.values() for t in ts),
                            key=lambda t: t.name):
                if t.host_indices is not None or t.device_indices is None:
                    continue
                k = len(t.device_indices)
                idx = self._host_tokens(self.aux_host, k)
                if idx is None:
                    self.evict_host(k, self.aux)
                    idx = self._host_tokens(self.aux_host, k)
                if idx is None:
                    failed = True
                    break
                t.host_indices = idx
                allocated.append(t)
            if failed:
                for t in allocated:
                    self._free_host(self.aux_host, t.host_indices)
                    t.host_indices = None
                self._free_host(self.host, host_indices)
                return 0
            core.commit_backup(nid, host_indices, comp_xfers)
            core._ev("backup", core.node_by_id(nid), n=n)
            lock = None if write_back else core.inc_lock_ref(nid).to_dec_params()
            publish = []
            for ts in comp_xfers.values():
                for t in ts:
                    publish.extend(t.nodes_to_load or ())
            if nid not in publish:
                publish.append(nid)
            self.writes[nid] = [core.mark_write_through_pending(
                list(dict.fromkeys(publish)), ack_id=nid), lock]
            written = n
        return written

    def _finish_writes(self) -> None:
        """writing_check(write_back=True): every write acked, in issue order."""
        while self.writes:
            self._finish_write(next(iter(self.writes)))

    def _finish_write(self, ack_id) -> None:
        """UnifiedRadixCache._finish_write_through_ack: finish_write_through on the
        published nodes, then the backup's device lock released."""
        publish, lock = self.writes.pop(ack_id)
        self.core.finish_write_through(publish, ack_id)
        if lock is not None:
            self.core.dec_lock_ref(ack_id, lock)

    def _replace_pending_write(self, ack_id, old, new) -> None:
        """UnifiedRadixCache._replace_pending_write_through_node."""
        pending = self.writes.get(ack_id)
        if pending is None or old not in pending[0]:
            return
        out = []
        for nid in pending[0]:
            out.extend(new if nid == old else (nid,))
        pending[0] = out

    def write_ids(self) -> list:
        """The acks in flight, in issue order (for the generator)."""
        return list(self.writes)

    def op_write_ack(self, op):
        """writing_check's ack of one write_through backup (op-trace v2 write_ack)."""
        if op["id"] not in self.writes:
            raise OpError("unknown_write_id")
        self._finish_write(op["id"])
        return {}

    def _backup_node_for_write_back(self, nid) -> bool:
        self._finish_writes()
        if self._backup([nid]) == 0:
            return False
        self._finish_writes()
        return True

    # -- eviction (UnifiedRadixCache._evict_components, write_back) ---------------

    def _evict(self, request: dict, targets: dict | None = None) -> dict:
        core = self.core
        tracker = {FULL: 0, self.aux: 0}

        def target_reached(ct):
            if targets is None or ct not in targets:
                return False
            return self._available(ct) >= targets[ct]

        def add(delta):
            for c, k in delta.items():
                tracker[c] += k

        for ct in (FULL, self.aux):
            request_cnt = request[ct]
            to_target = ct is FULL and request_cnt > 0 and targets is not None and ct in targets
            if target_reached(ct) or (not to_target and tracker[ct] >= request_cnt):
                continue
            quota = request_cnt
            if to_target:
                quota = max(request_cnt, tracker[ct] + core.full_evictable_size())
            core.evict_device_start(ct, quota)
            try:
                while True:
                    step = core.evict_device_next_node(ct, tracker)
                    if step.mamba_backup_node_id is not None:
                        nid = step.mamba_backup_node_id
                        if self.mamba_host.free_pages < 1:
                            self.evict_host(1, MAMBA)
                        self._backup_node_for_write_back(nid)
                        step = core.finish_mamba_state_eviction(nid)
                    elif step.swa_backup_node_id is not None:
                        # _evict_device_next_node: reserve host room for the whole
                        # unbacked window, back up, then resume the tombstone.
                        nid = step.swa_backup_node_id
                        needed = step.swa_backup_num_tokens
                        if self.aux_host.free_pages * self.ps < needed:
                            self.evict_host(needed, SWA)
                        self._backup_node_for_write_back(nid)
                        step = core.finish_swa_state_eviction(nid)
                    node_id, progress = step.node_id, step.made_progress
                    self._drain(step)
                    add(step.tracker)
                    if node_id is None:
                        if not progress:
                            break
                    else:
                        leaf = core.evict_device_leaf(node_id, core.is_write_back)
                        backup_kv = leaf.backup_kv
                        self._drain(leaf)
                        add(leaf.tracker)
                        if backup_kv is not None:
                            if self._backup(backup_kv.node_ids) > 0:
                                self._finish_writes()
                                res = core.demote(node_id)
                            else:
                                res = core.drop_subtree_no_host(node_id)
                                if not res.is_dropped:
                                    core._ev("drop_declined", core.node_by_id(node_id))
                            self._drain(res)
                            add(res.tracker)
                    if target_reached(ct):
                        break
            finally:
                core.evict_device_end(ct)
        if not self.wt:
            self._finish_writes()
        return tracker

    def op_evict_host(self, op):
        """UnifiedRadixCache.evict_host for one component: FULL (duplicate reclaim
        first, then host leaves) or Mamba (its host LRU)."""
        aux = CT_NAME[self.aux]
        if ("full" in op) == (aux in op):
            raise OpError("evict_host_needs_one_component")
        ct = FULL if "full" in op else self.aux
        return {"freed": self.evict_host(int(op.get(CT_NAME[ct], 0)), ct)}

    # -- reads --------------------------------------------------------------------

    def _device_path_values(self, key: RadixKey, upto: int):
        """As the device-tier read, and the reused prefix must be on device."""
        node, got = self.core.root_node, 0
        while got < upto:
            child = node.children.get(key[got:].child_key(self.ps))
            if child is None or child.component_data[FULL].value is None:
                raise OpError("bad_prev")
            m = child.key.match(key[got:], page_size=self.ps)
            if m < len(child.key) or got + m > upto:
                break
            got += m
            node = child
        return super()._device_path_values(key, upto)

    def _peek_best_ht(self, tokens):
        """The node a HiCache match of tokens would end at (read-only): the deepest
        wholly matched node, FULL on either tier, with a state on either tier."""
        key, node, best = self.key(tokens), self.core.root_node, self.core.root_node
        while len(key) > 0:
            child = node.children.get(key.child_key(self.ps))
            if child is None or (child.evicted and not child.backuped):
                break
            m = child.key.match(key, page_size=self.ps)
            if m < len(child.key):
                break
            cd = child.component_data[MAMBA]
            if cd.value is not None or cd.host_value is not None:
                best = child
            node, key = child, key[m:]
        return best

    def _host_fields(self, r) -> dict:
        if self.kind == "swa":
            return {"host_len": r.host_hit_length, "dnode": r.last_device_node,
                    "swa_host_len": r.swa_host_hit_length}
        return {"host_len": r.host_hit_length, "dnode": r.last_device_node,
                "mamba_host_len": r.mamba_host_hit_length}

    # -- load-back (UnifiedRadixCache.load_back / loading_check) ------------------

    def op_load_back(self, op):
        lid = op["id"]
        if lid in self.load_backs:
            raise OpError("duplicate_load_back_id")
        core, mamba = self.core, self.comps[self.aux]
        rid = op.get("req")
        if rid is not None and self.kind != "mamba":
            raise OpError("no_mamba_component")
        if rid is not None and rid not in self.held:
            # prepare_load_back asserts when no slot can be found for the request's
            # copy: refuse first (read-only), as a copy on write's match does.
            best = self._peek_best_ht(op["tokens"])
            cd = best.component_data[MAMBA]
            if (cd.value is None and cd.host_value is not None
                    and self.req_pool.mamba_allocator.pool.free_pages == 0
                    and core.component_evictable_size_[MAMBA] <= 0):
                raise OpError("mamba_full")
        r, out = self._match(op["tokens"])
        out.update(started=False, loaded=0)
        anchor = r.best_match_node
        if not (core.is_full_device_evicted(anchor) or r.host_hit_length > 0
                or r.mamba_host_hit_length > 0 or r.swa_host_hit_length > 0):
            out["reason"] = "no_host_tail"
            return out
        req = None
        if rid is not None:
            holds = rid in self.held
            req = SimpleNamespace(kv=SimpleNamespace(
                holds_mamba=holds,
                mamba_pool_idx=self.held[rid][0] if holds else None))
        host_lock = core.inc_host_lock_ref(anchor).to_dec_params()
        lock = core.inc_lock_ref(anchor).to_dec_params()
        prep = mamba.prepare_load_back(anchor, req=req)
        ok = False
        try:
            reason = self._load_back_transfers(anchor, req, lock, host_lock, out)
            ok = reason is None
            if ok:
                self.load_backs[lid] = (anchor, core.inc_lock_ref(anchor).to_dec_params(),
                                        host_lock)
        finally:
            mamba.finalize_load_back(req, prep, ok)
        if not ok:
            out["reason"] = reason
            return out
        if req is not None and req.kv.mamba_pool_idx is not None:
            self.held[rid] = req.kv.mamba_pool_idx.reshape(1)
        out["started"] = True
        return out

    def _load_back_transfers(self, anchor, req, lock, host_lock, out):
        core = self.core
        kv_xfer, comp_xfers = core.build_load_back_spec(anchor, req=req)
        n = len(kv_xfer.host_indices)
        if n < max(1, self.load_back_threshold) and not comp_xfers:
            core.dec_lock_ref(anchor, lock)
            core.dec_host_lock_ref(anchor, host_lock)
            return "below_threshold"
        avail = self._available(FULL)
        if avail < n:
            self.evict_for_alloc(EvictParams(num_tokens=n - avail))
            if self._available(FULL) < n:
                core.dec_lock_ref(anchor, lock)
                core.dec_host_lock_ref(anchor, host_lock)
                return "no_device_space"
        # HybridCacheController.load: FULL rows, then the side pools' device slots
        # (_resolve_device_transfers, evicting once through device_mamba_evict_fn).
        device_indices = self.alloc.alloc_request(n, 0) if n else torch.empty((0,), dtype=torch.int64)
        failed = False
        for t in (t for ts in comp_xfers.values() for t in ts):
            if t.device_indices is not None or t.host_indices is None:
                continue
            k = len(t.host_indices)
            idx = self._device_aux_alloc(k)
            if idx is None:
                self._device_aux_evict(k)
                idx = self._device_aux_alloc(k)
            if idx is None:
                failed = True
                break
            t.device_indices = idx
        core.dec_lock_ref(anchor, lock)
        if failed:
            for t in (t for ts in comp_xfers.values() for t in ts):
                if t.nodes_to_load and t.device_indices is not None:
                    self._device_aux_free(t.device_indices)
                    t.device_indices = None
            if n:
                self.alloc.free_full_segment(device_indices) if self.kind == "swa" \
                    else self.alloc.free_segment(device_indices)
            core.dec_host_lock_ref(anchor, host_lock)
            return "no_mamba_space" if self.kind == "mamba" else "no_swa_space"
        for nid in kv_xfer.nodes_to_load or ():
            node = core.node_by_id(nid)
            core._ev("load", node, n=len(node.component_data[FULL].host_value))
        self._apply(core.commit_load_back(anchor, device_indices, kv_xfer, comp_xfers))
        out["loaded"] = n
        return None

    # The component's device slots for a load (the SWA entry's device_alloc_fn /
    # device_free_fn over the SWA pool, device_evict_fn _evict_swa_for_device_alloc;
    # Mamba's mamba_allocator with _evict_mamba_for_device_alloc).
    def _device_aux_alloc(self, k: int):
        if self.kind == "mamba":
            return self.req_pool.mamba_allocator.alloc(k)
        ps = self.ps
        if k > self.alloc.swa.free_pages * ps:
            return None
        pages = self.alloc.swa.alloc_pages(k // ps)
        return torch.tensor([p * ps + o for p in pages for o in range(ps)], dtype=torch.int64)

    def _device_aux_free(self, t) -> None:
        if self.kind == "mamba":
            self.req_pool.mamba_allocator.free(t)
            return
        for x in t.reshape(-1)[::self.ps].tolist():
            self.alloc.swa.free_page(x // self.ps)

    def _device_aux_evict(self, k: int) -> None:
        short = max(0, k - self._available(self.aux))
        if short:
            if self.kind == "mamba":
                self.evict_for_alloc(EvictParams(num_tokens=0, mamba_num=short))
            else:
                self.evict_for_alloc(EvictParams(num_tokens=0, swa_num_tokens=short))

    def op_load_back_ack(self, op):
        lid = op["id"]
        if lid not in self.load_backs:
            raise OpError("unknown_load_back_id")
        anchor, lock, host_lock = self.load_backs.pop(lid)
        self.core.dec_lock_ref(anchor, lock)
        self.core.dec_host_lock_ref(anchor, host_lock)
        self.core.finish_load_back(anchor)
        return {}

    # -- driver ---------------------------------------------------------------------

    def op_insert(self, op):
        out = super().op_insert(op)
        if not self.wt:
            self._finish_writes()
        return out

    def op_dump(self, op):
        out = super().op_dump(op)
        core = self.core
        anchors = {a: lid for lid, (a, _, _) in self.load_backs.items()}
        for rec in out["tree"]:
            node = core.node_by_id(rec["id"])
            f, m = node.component_data[FULL], node.component_data[self.aux]
            pend = node.load_back_pending_id
            a = CT_NAME[self.aux]
            rec.update({
                "dev": f.value is not None, "host": f.host_value is not None,
                "host_lock": f.host_lock_ref, a + "_host": m.host_value is not None,
                a + "_host_lock": m.host_lock_ref,
                "pinned_by": None if pend is None else anchors.get(pend, pend),
            })
        lru, order = core.host_lru_lists[self.aux], []
        pt = lru._pt
        x = lru.head.lru_next[pt]
        while x is not lru.tail:
            order.append(x.id)
            x = x.lru_next[pt]
        out["host_lru"] = order
        out["h_leaves"] = sorted(n.id for n in core.evictable_host_leaves)
        out["duplicates"] = list(core.full_host_duplicates.keys())
        if self.wt:
            for rec in out["tree"]:
                node = core.node_by_id(rec["id"])
                rec.update(write_pending=node.write_through_pending_id,
                           hits=node.hit_count)
            out["write_ids"] = list(self.writes)
        return out

    OPS = {**HybridOracle.OPS, "evict_host": op_evict_host, "load_back": op_load_back,
           "load_back_ack": op_load_back_ack, "insert": op_insert, "dump": op_dump,
           "write_ack": op_write_ack}

    def summary(self) -> dict:
        out = super().summary()
        out["host"] = self.host.used_tokens
        out[CT_NAME[self.aux] + "_host"] = self.aux_host.used_tokens
        out["digest"] = self.core.write_back_duplicate_reclaim_digest
        if self.wt:
            out["writes"] = len(self.writes)
        return out

    def check(self) -> None:
        core = self.core
        saved = None
        if self.wt and self.load_backs:
            # Under write_through commit_load_back pins nothing, so a loaded node is a
            # settled duplicate at once but tracked only at the ack
            # (finish_load_back's walk); sanity_check would call it missing. Count the
            # in-flight loads' root paths as tracked for the check alone.
            saved = dict(core.full_host_duplicates)
            for anchor, _, _ in self.load_backs.values():
                x = core.node_by_id(anchor)
                while x is not None and x is not core.root_node:
                    if core._is_settled_full_host_duplicate(x):
                        core.full_host_duplicates.setdefault(x.id, x)
                    x = x.parent
        try:
            core.sanity_check([(a, a) for a in self.writes],
                              [(a, a) for a, _, _ in self.load_backs.values()])
        finally:
            if saved is not None:
                core.full_host_duplicates.clear()
                core.full_host_duplicates.update(saved)
        dev = host = a = ah = 0
        for n in core._node_arena.values():
            if n is core.root_node:
                continue
            f, m = n.component_data[FULL], n.component_data[self.aux]
            dev += 0 if f.value is None else len(f.value)
            host += 0 if f.host_value is None else len(f.host_value)
            a += 0 if m.value is None else len(m.value)
            ah += 0 if m.host_value is None else len(m.host_value)
        res_full, res_swa = self._reserved_tokens()
        assert dev == self.alloc.full.used_tokens - res_full, (dev, self.alloc.full.used_tokens)
        assert host == self.host.used_tokens, (host, self.host.used_tokens)
        if self.kind == "swa":
            assert a == self.alloc.swa.used_tokens - res_swa, (a, self.alloc.swa.used_tokens)
        else:
            assert a == self.req_pool.mamba_allocator.pool.used_tokens - len(self.held)
        assert ah == self.aux_host.used_tokens, (ah, self.aux_host.used_tokens)
        aux = self.aux
        assert core.component_evictable_size_[FULL] + core.component_protected_size_[FULL] == dev
        assert core.component_evictable_size_[aux] + core.component_protected_size_[aux] == a



def replay(lines, out, check=False) -> int:
    oracle, errors = None, 0
    for i, line in enumerate(lines):
        line = line.strip()
        if not line:
            continue
        op = json.loads(line)
        if oracle is None:
            if op.get("op") != "header":
                raise SystemExit("trace must start with a header line")
            oracle = (HostHybridOracle if op.get("hicache") is True else HybridOracle)(op)
            rec = {"op": "header", "events": [], **oracle.summary()}
        else:
            rec = oracle.apply(op)
            errors += "error" in rec
            if check:
                oracle.check()
        out.write(json.dumps({"i": i, **rec}, separators=(",", ":")) + "\n")
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("-o", "--out")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    with open(args.trace) as f:
        lines = f.readlines()
    out = open(args.out, "w") if args.out else sys.stdout
    try:
        errors = replay(lines, out, check=args.check)
    finally:
        if args.out:
            out.close()
    if errors:
        print(f"{errors} op(s) rejected (see 'error' fields)", file=sys.stderr)


if __name__ == "__main__":
    main()
