"""Scripted faults: the SGLang TP-2 harness's ``--fault`` hooks, on one rank, at a step.

Each kind acts exactly as ../shared/oracle/server/instrument.py
``Instrument._install_fault`` installs it (the harness's step is ``CLOCK.step``, the
engine's ``_iter_step`` under ``engine.clock: steps``):

* ``host_alloc_fail``: the host pool's ``alloc`` returns None once, at the first
  backup at or after step K (the tree's ``host_alloc_fail`` hook is its alloc);
* ``ack_delay``: copies recorded in steps K..K+20 on the rank complete E steps later
  (hicache_cpu.py ``StepEvent.record``: ``extra_delay`` on the d2h and h2d streams);
* ``reclaim_skip``: Python core: every duplicate reclaim of the first step >= K that
  reclaims one is skipped, the host copy kept (``_release_full_host_duplicate``
  returns at once); Rust core, whose reclaim cannot be wrapped per node: after the
  first host eviction at or after K that changed the digest, the rank's reported
  digest is XORed with 1 from then on (``drive_host_eviction`` wrapped, the
  ``write_back_duplicate_reclaim_digest`` property perturbed).

A fault counts as fired only where it acted on its rank: a failed alloc, a copy
really delayed, a reclaim really skipped or a digest really perturbed. The faulted
rank gets its own replica from t=0 (its allocator or copy streams are its own).
"""

from __future__ import annotations

# instrument.py _install_fault: CLOCK.extra_delay[kind] = (K, K + 20, E)
ACK_DELAY_WINDOW_STEPS = 20


class Fault:
    __slots__ = ("rank", "kind", "step", "extra", "fired_at", "fired")

    def __init__(self, rank: int, kind: str, step: int, extra: int | None):
        self.rank, self.kind, self.step, self.extra = rank, kind, step, extra
        self.fired_at: int | None = None  # the first step it acted
        self.fired = 0                    # how many times it acted

    def report(self) -> dict:
        d = {"rank": self.rank, "kind": self.kind, "step": self.step}
        if self.extra is not None:
            d["extra_steps"] = self.extra
        d.update(fired_at=self.fired_at, fired=self.fired)
        return d


class ScriptedFaults:
    """The run's scripted faults; ``step()`` is the engine's current step."""

    def __init__(self, specs, step):
        self.faults = [Fault(*s) for s in specs]
        self._step = step
        self._ack = {f.rank: f for f in self.faults if f.kind == "ack_delay"}

    def ranks(self) -> set[int]:
        return {f.rank for f in self.faults}

    def install(self, c) -> None:
        """Hook the faults of a single-rank replica's rank into its tree."""
        if len(c.ranks) != 1:
            return
        for f in self.faults:
            if f.rank != c.ranks[0]:
                continue
            if f.kind == "host_alloc_fail":
                self._alloc_fail(c.tree, f)
            elif f.kind == "reclaim_skip":
                if c.tree.rust_core:
                    self._digest_only(c.tree, f)
                else:
                    self._skip_reclaims(c.tree, f)

    def _alloc_fail(self, tree, f: Fault) -> None:
        prev = tree.host_alloc_fail
        step = self._step

        def fail() -> bool:
            if f.fired_at is None and step() >= f.step:
                f.fired_at = step()
                f.fired += 1
                return True
            return prev is not None and prev()

        tree.host_alloc_fail = fail

    def _digest_only(self, tree, f: Fault) -> None:
        evict = tree._evict_host
        step = self._step

        def drive(n, res):
            d0 = tree.digest
            freed = evict(n, res)
            if f.fired_at is None and step() >= f.step and tree.digest != d0:
                f.fired_at = step()
                f.fired += 1
                tree.digest_xor = 1
            return freed

        tree._evict_host = drive

    def _skip_reclaims(self, tree, f: Fault) -> None:
        release = tree.release_duplicate
        step = self._step

        def rel(node, pass_no):
            if f.fired_at is None and step() >= f.step:
                f.fired_at = step()
            if f.fired_at == step():
                f.fired += 1
                return 0
            return release(node, pass_no)

        tree.release_duplicate = rel

    def ack_extra(self, c, step: int) -> int:
        """Extra steps for a copy recorded at ``step`` on replica ``c``."""
        if not self._ack or len(c.ranks) != 1:
            return 0
        f = self._ack.get(c.ranks[0])
        if f is None or not (f.step <= step <= f.step + ACK_DELAY_WINDOW_STEPS):
            return 0
        if f.fired_at is None:
            f.fired_at = step
        f.fired += 1
        return f.extra

    def fired(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.faults:
            if f.fired:
                k = f"fault {f.kind} on rank {f.rank}"
                out[k] = out.get(k, 0) + f.fired
        return out

    def report(self) -> list[dict]:
        return [f.report() for f in self.faults]
