"""The cross-rank MIN all_reduce that SGLang runs once per scheduler step.

Two backends behind one interface:

- ``simulated``: an in-process element-wise MIN over the ranks' vectors.
- ``torch``: real ``torch.distributed`` with one OS process per rank; gloo on CPU
  tensors (SGLang runs this all_reduce on its CPU group, `tp_cpu_group`), or NCCL on
  CUDA tensors when asked and one GPU per rank exists.

Before any reduction, the call log checks that every rank issued the same
collective with the same shape. A rank that skips a call, or a call whose sizes
differ, is what real hardware turns into a hang (the gloo/NCCL watchdog) or a size
mismatch; it raises ``CollectiveError`` instead of being reduced as if it were fine.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from sim.errors import UserError


class CollectiveError(Exception):
    """A collective that would hang or fail on real hardware."""

    def __init__(self, kind: str, call: int, tag: str, detail: str):
        super().__init__(f"{kind} at collective #{call} ({tag}): {detail}")
        self.kind = kind  # "hang" or "size_mismatch"
        self.call = call
        self.tag = tag
        self.detail = detail


@dataclass
class CallRecord:
    call: int
    tag: str
    shapes: dict  # rank -> vector length, for the ranks that joined


class CallLog:
    """Checks that all ranks issue the same sequence of collectives."""

    def __init__(self, world: int):
        self.world = world
        self.calls = 0

    def check(self, tag: str, vectors: dict[int, list[int]]) -> None:
        self.calls += 1
        missing = [r for r in range(self.world) if r not in vectors]
        if missing:
            joined = sorted(vectors)
            raise CollectiveError(
                "hang", self.calls, tag,
                f"ranks {joined} entered all_reduce, ranks {missing} skipped it; "
                "the joined ranks block until the watchdog fires")
        sizes = {r: len(v) for r, v in vectors.items()}
        if len(set(sizes.values())) > 1:
            raise CollectiveError("size_mismatch", self.calls, tag,
                                  f"tensor sizes differ across ranks: {sizes}")


class Collective:
    """Interface: ``all_reduce_min(tag, vectors) -> reduced`` where ``vectors`` maps
    rank -> list of ints (one per joined rank) and the result is what every rank
    gets back."""

    name = "base"

    def __init__(self, world: int):
        self.world = world
        self.log = CallLog(world)

    def all_reduce_min(self, tag: str, vectors: dict[int, list[int]]) -> list[int]:
        self.log.check(tag, vectors)
        return self._reduce(vectors)

    def _reduce(self, vectors):  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


class SimulatedCollective(Collective):
    name = "simulated"

    def _reduce(self, vectors):
        it = iter(vectors.values())
        out = list(next(it))
        for vec in it:
            out = [a if a <= b else b for a, b in zip(out, vec)]
        return out


# ---------------------------------------------------------------- torch backend
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, device: str, conn) -> None:
    """One rank's process: joins the group, then serves all_reduce requests."""
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if device == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    conn.send(("ready", None))
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            t = torch.tensor(msg, dtype=torch.int64)
            if device == "cuda":
                t = t.cuda()
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            conn.send(("ok", t.cpu().tolist()))
    finally:
        dist.destroy_process_group()
        conn.close()


class TorchCollective(Collective):
    """Real torch.distributed: one spawned process per rank, driven over pipes."""

    name = "torch"

    def __init__(self, world: int, device: str = "cpu"):
        super().__init__(world)
        try:
            import torch  # noqa: F401
            import torch.multiprocessing as mp
        except ImportError:
            raise UserError("collective backend 'torch' needs torch; install it with "
                            "`pip install torch==2.13.0`") from None
        if device == "cuda":
            import torch

            if not torch.cuda.is_available() or torch.cuda.device_count() < world:
                raise UserError(f"collective device 'cuda' needs {world} GPUs (NCCL rejects "
                                f"two ranks on one GPU); found {torch.cuda.device_count()}",
                                where="collective.device")
        ctx = mp.get_context("spawn")
        port = _free_port()
        self._conns, self._procs = [], []
        for rank in range(world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(rank, world, port, device, child), daemon=True)
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)
        for conn in self._conns:
            # Start-up is interpreter + torch import per rank: seconds on an idle
            # machine, much longer on an oversubscribed one.
            if not conn.poll(600):
                self.close()
                raise RuntimeError("torch.distributed workers did not start within 600 s")
            conn.recv()

    def _reduce(self, vectors):
        for rank, conn in enumerate(self._conns):
            conn.send(list(vectors[rank]))
        results = [conn.recv()[1] for conn in self._conns]
        first = results[0]
        assert all(r == first for r in results), "ranks got different all_reduce results"
        return first

    def close(self) -> None:
        for conn in getattr(self, "_conns", []):
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in getattr(self, "_procs", []):
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        self._conns, self._procs = [], []


COLLECTIVES = {"simulated": SimulatedCollective, "torch": TorchCollective}


def make_collective(backend: str, world: int, device: str = "cpu") -> Collective:
    from sim.policies import resolve

    cls = resolve(COLLECTIVES, backend, "collective backend", where="collective.backend")
    return cls(world, device) if cls is TorchCollective else cls(world)
