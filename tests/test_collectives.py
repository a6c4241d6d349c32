"""The collective layer: the simulated backend's MIN and its model of how a real group
fails, and the torch backend doing the same calls for real (gloo, one process per rank).

Each torch group costs seconds to start (a torch import per rank), so the torch tests are
few, small, and share a world-2 group where they can. Their ``timeout_s=2`` is the
product's anti-hang mechanism (gloo's own timeout), not a speed assertion.
"""

import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch  # a dev dependency: the torch tests fail, not skip, without it

from conftest import ROOT
from sim import collectives as C
from sim.collectives import (LINES, CollectiveError, SimulatedCollective, TorchCollective,
                             gloo_size_check, make_collective)
from sim.errors import UserError

TIMEOUT_S = 2.0


def is_gloo_timeout(line: str) -> bool:
    """gloo's own timeout after TIMEOUT_S; whether the lowest failing rank was waiting
    to receive or to send depends on where the ring stopped, so both are accepted."""
    prefix = "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:"
    return line.startswith(prefix) and (
        line.endswith("] Timed out waiting 2000ms for recv operation to complete")
        or line.endswith("] Timed out waiting 2000ms for send operation to complete"))


def raises(fn, *args) -> CollectiveError:
    with pytest.raises(CollectiveError) as err:
        fn(*args)
    return err.value


# ----------------------------------------------------------------------------------
# simulated
# ----------------------------------------------------------------------------------
def test_min_is_element_wise_over_the_entering_ranks():
    coll = SimulatedCollective(3)
    assert coll.all_reduce_min(1, "sync", {0: [3, -3, 9], 1: [1, -1, 2**62], 2: [2, -2, -2**62]}) == [1, -3, -2**62]
    assert coll.calls == 1
    assert coll.log == [{"call": 1, "step": 1, "site": "sync", "ranks_in": [0, 1, 2],
                         "sizes": {0: 3, 1: 3, 2: 3}}]


def test_a_skip_is_a_hang_with_gloos_timeout_line():
    coll = SimulatedCollective(2)
    err = raises(coll.all_reduce_min, 7, "sync", {0: [1, -1]})
    assert (err.kind, err.step, err.site, err.ranks_in, err.ranks_out) == ("hang", 7, "sync", [0], [1])
    # a real server's gloo group times out after torch's default 30 min
    assert err.line == ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
                        "unbound_buffer.cc:78] Timed out waiting 1800000ms for recv operation to complete")
    assert "ranks [0] entered all_reduce, ranks [1] skipped it" in str(err)
    assert coll.calls == 1  # the call was issued, by the ranks that entered it


def test_under_nccl_a_skip_is_the_watchdogs_line():
    coll = SimulatedCollective(2, "cuda")
    coll.all_reduce_min(1, "sync", {0: [1], 1: [2]})
    err = raises(coll.all_reduce_min, 2, "sync", {1: [5, 6, 7]})
    assert err.kind == "hang" and err.line == (
        "[PG ID 0 PG GUID 0(default_pg) Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, "
        "NumelIn=3, NumelOut=3, Timeout(ms)=600000) ran for 600100 milliseconds before timing out.")


def test_size_mismatch_and_the_line_gloo_dies_with():
    coll = SimulatedCollective(2)
    err = raises(coll.all_reduce_min, 3, "load_check", {0: [1, 2, 3, 4], 1: [1, 2, 3, 4, 5]})
    assert err.kind == "size_mismatch" and err.site == "load_check" and err.ranks_out == []
    assert "tensor sizes differ across ranks: {0: 4, 1: 5}" in str(err)
    assert err.line == LINES["gloo_size"].format(sent=16, expected=8)
    # equal ring segments (1 element each): gloo checks nothing, the longer rank waits
    err = raises(coll.all_reduce_min, 3, "sync", {0: [1, 2, 3, 4], 1: [1, 2]})
    assert err.kind == "size_mismatch" and err.line == LINES["gloo_timeout"].format(ms=1800000)


@pytest.mark.parametrize("numels,expected", [
    # per-rank element counts -> the "X vs Y" bytes gloo's enforce printed, or None
    # where gloo blocked instead; each one observed with real gloo (torch 2.13.0, int64)
    ([4, 5], (16, 8)), ([40, 20], (80, 40)), ([400, 200], (800, 400)),
    ([1000, 999], (2000, 1992)), ([12, 10], (24, 8)), ([4, 2], None), ([10, 9], None),
    ([7, 6], None), ([6, 6, 5], None), ([100, 100, 97], (120, 96)),
    ([40, 40, 40, 20], (40, 24)), ([17, 16, 16, 16], (24, 16)), ([16, 16, 16, 15], (16, 8)),
    ([4, 4, 4, 5], None), ([8, 8, 8, 4], None),
])
def test_the_gloo_segment_model_reproduces_what_gloo_did(numels, expected):
    assert gloo_size_check(numels, len(numels), 8) == expected


def test_forward_mismatch_and_skip():
    coll = SimulatedCollective(4)
    coll.forward(5, {0: 512, 1: 512, 2: 512, 3: 512})
    err = raises(coll.forward, 6, {0: 513, 1: 512, 2: 512, 3: 512})
    assert err.kind == "size_mismatch" and err.site == "forward" and err.step == 6
    assert "numel differs across ranks: {0: 513, 1: 512, 2: 512, 3: 512}" in err.detail
    # the forward all_reduce runs on the GPU group in a real server: NCCL's watchdog
    assert err.line.startswith("[PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog caught collective "
                               "operation timeout: WorkNCCL(SeqNum=2,")
    assert "NumelIn=513" in err.line
    err = raises(coll.forward, 7, {0: 8, 2: 8})
    assert err.kind == "hang" and err.ranks_out == [1, 3]
    assert [e["site"] for e in coll.log] == ["forward"] * 3 and coll.calls == 3


def test_transport_follows_the_device_and_timeout_shows_in_the_lines():
    assert make_collective("simulated", 2).transport == "gloo"
    assert make_collective("simulated", 2, "cuda").transport == "nccl"
    assert make_collective("simulated", 2).name == "simulated"
    err = raises(make_collective("simulated", 2, timeout_s=300).all_reduce_min, 1, "sync", {1: [0]})
    assert "Timed out waiting 300000ms" in err.line
    with pytest.raises(UserError, match="collective.backend"):
        make_collective("mpi", 2)


def test_bad_inputs_are_engine_bugs_not_collective_errors():
    coll = SimulatedCollective(2)
    with pytest.raises(ValueError):
        coll.all_reduce_min(1, "sync", {})
    with pytest.raises(ValueError):
        coll.all_reduce_min(1, "sync", {0: [1], 2: [1]})


def test_the_log_is_bounded_and_calls_keeps_counting():
    coll = SimulatedCollective(2)
    for step in range(100):
        coll.all_reduce_min(step, "sync", {0: [step], 1: [step]})
    assert coll.calls == coll.log.calls == 100
    assert len(coll.log) == C.LOG_CALLS and coll.log[0]["call"] == 100 - C.LOG_CALLS + 1


def test_the_compat_call_keeps_the_old_message():
    # compat: removed once the engine uses all_reduce_min(step, site, inputs)
    coll = SimulatedCollective(2)
    assert coll.all_reduce_min("check_hicache_events", {0: [3], 1: [2]}) == [2]
    err = raises(coll.all_reduce_min, "check_hicache_events", {0: [0, 1, 0, 0]})
    assert err.step is None and str(err) == (
        "hang at collective #2 (check_hicache_events): ranks [0] entered all_reduce, ranks [1] "
        "skipped it; the joined ranks block until the watchdog fires")


def test_forward_sizes_above_the_cap_keep_equality():
    cap = C.FORWARD_NUMEL_CAP
    sizes = C._forward_sizes({0: 10, 1: cap, 2: cap + 5, 3: 3 * cap, 4: cap + 5})
    assert sizes[0] == 10 and sizes[1] == cap and max(sizes.values()) <= cap + 5
    assert sizes[2] == sizes[4] != sizes[3] and len({sizes[1], sizes[2], sizes[3]}) == 3


# ----------------------------------------------------------------------------------
# torch: the NCCL path without a GPU
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("available,count", [(False, 0), (True, 1)])
def test_cuda_without_enough_gpus_is_one_line(monkeypatch, available, count):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    with pytest.raises(UserError) as err:
        make_collective("torch", 2, "cuda")
    assert str(err.value) == (f"collective.device: collective device 'cuda' needs 2 GPUs (NCCL "
                              f"rejects two ranks on one GPU); found {count}")


def test_worker_env_keeps_gloo_and_nccl_on_loopback():
    assert C._worker_env("cpu", "lo")["GLOO_SOCKET_IFNAME"] == "lo"
    assert "NCCL_SOCKET_IFNAME" not in C._worker_env("cpu", "lo")
    env = C._worker_env("cuda", "lo")
    assert env["NCCL_SOCKET_IFNAME"] == "lo" and env["GLOO_SOCKET_IFNAME"] == "lo"
    assert "GLOO_SOCKET_IFNAME" not in C._worker_env("cpu", None)  # the 127.0.0.1 device instead


def test_a_dead_workers_last_words_are_read_from_its_stderr(tmp_path):
    # what the C++ side prints as a process dies: no GPU here, so the NCCL line is fed in
    coll = object.__new__(TorchCollective)
    coll._tmpdir = str(tmp_path)
    (tmp_path / "rank0.stderr").write_text(
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        "  what():  " + LINES["gloo_size"].format(sent=16, expected=8) + "\n")
    (tmp_path / "rank1.stderr").write_text(
        "[rank1]:[E512 10:00:00.123456789 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) "
        "Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, "
        "NumelIn=4, NumelOut=4, Timeout(ms)=2000) ran for 2041 milliseconds before timing out.\n")
    assert coll._death_line(0) == LINES["gloo_size"].format(sent=16, expected=8)
    assert coll._death_line(1).startswith("[PG ID 0 PG GUID 0(default_pg) Rank 1] Watchdog caught")
    assert coll._death_line(2) is None


# ----------------------------------------------------------------------------------
# torch/gloo for real
# ----------------------------------------------------------------------------------
def alive(pid: int) -> bool:
    """Running, i.e. neither gone nor a zombie waiting for a reaper."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def listening(pids) -> list[str]:
    """Local addresses of the LISTEN TCP sockets that ``pids`` hold open."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        with open(f"/proc/net/{table}") as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                if cols[3] != "0A" or cols[9] not in inodes:  # 0A: TCP_LISTEN
                    continue
                addr_hex, port = cols[1].split(":")
                # the kernel prints the address as 32-bit words in host (little-endian) order
                raw = b"".join(bytes.fromhex(addr_hex[i:i + 8])[::-1] for i in range(0, len(addr_hex), 8))
                found.append(f"{socket.inet_ntop(family, raw)}:{int(port, 16)}")
    return found


def assert_torn_down(coll: TorchCollective, pids):
    tmp = coll._tmpdir
    coll.close()
    assert not [p for p in pids if alive(p)]
    assert not os.path.exists(tmp)
    coll.close()  # twice is fine


@pytest.fixture(scope="module")
def gloo2():
    coll = make_collective("torch", 2, timeout_s=TIMEOUT_S)
    yield coll
    coll.close()


def seeded_calls(world: int, n: int, seed: int):
    rng = random.Random(seed)
    for step in range(n):
        if rng.random() < 0.2:
            yield "forward", step, rng.randint(0, 5000)
        else:
            length = rng.randint(1, 6)
            yield "min", step, {r: [rng.randint(-2**62, 2**62) for _ in range(length)] for r in range(world)}


def run_seeded(coll, world: int):
    sim = SimulatedCollective(world)
    for what, step, arg in seeded_calls(world, 30, seed=world):
        if what == "forward":
            for c in (sim, coll):
                c.forward(step, {r: arg for r in range(world)})
        else:
            assert coll.all_reduce_min(step, "sync", arg) == sim.all_reduce_min(step, "sync", arg)
    assert coll.calls == sim.calls == 30 and list(coll.log) == list(sim.log)
    assert coll.transport == "gloo" and coll.name == "torch"


def test_gloo_agrees_with_simulated_at_world_2(gloo2):
    run_seeded(gloo2, 2)


def test_gloo_agrees_with_simulated_at_world_4():
    coll = make_collective("torch", 4, timeout_s=TIMEOUT_S)
    try:
        run_seeded(coll, 4)
    finally:
        coll.close()


@pytest.mark.parametrize("iface", ["auto", None], ids=["GLOO_SOCKET_IFNAME", "device_on_127.0.0.1"])
def test_nothing_listens_beyond_loopback(gloo2, iface):
    coll = gloo2 if iface == "auto" else TorchCollective(2, timeout_s=TIMEOUT_S, _iface=None)
    try:
        assert coll.all_reduce_min(0, "sync", {0: [4, 1], 1: [3, 2]}) == [3, 1]
        found = listening(coll.pids)
        assert found, "gloo's listening sockets were not found; the check would be vacuous"
        assert all(a.rsplit(":", 1)[0] in ("127.0.0.1", "::1") for a in found), found
    finally:
        if coll is not gloo2:
            coll.close()


def test_a_really_skipped_call_is_reported_as_a_hang_by_gloos_timeout():
    coll = make_collective("torch", 2, timeout_s=TIMEOUT_S)
    pids = coll.pids
    coll.all_reduce_min(1, "sync", {0: [1, -1], 1: [2, -2]})
    err = raises(coll.all_reduce_min, 2, "sync", {0: [0, 1, 0, 0]})
    expected = raises(SimulatedCollective(2).all_reduce_min, 2, "sync", {0: [0, 1, 0, 0]})
    assert (err.kind, err.ranks_in, err.ranks_out) == ("hang", [0], [1])
    assert is_gloo_timeout(err.line)  # what gloo itself raised in rank 0
    assert err.detail == expected.detail
    with pytest.raises(RuntimeError, match="unusable"):
        coll.all_reduce_min(3, "sync", {0: [1], 1: [1]})
    assert_torn_down(coll, pids)  # rank 0 sits in its failed group, rank 1 idles


def test_a_real_size_mismatch_aborts_the_shorter_rank_with_gloos_enforce():
    coll = make_collective("torch", 2, timeout_s=TIMEOUT_S)
    pids = coll.pids
    inputs = {0: [1, 2, 3, 4], 1: [1, 2, 3, 4, 5]}
    err = raises(coll.all_reduce_min, 4, "sync", inputs)
    expected = raises(SimulatedCollective(2).all_reduce_min, 4, "sync", inputs)
    assert err.kind == "size_mismatch" and err.ranks_out == []
    assert err.line == expected.line == LINES["gloo_size"].format(sent=16, expected=8)
    assert not alive(pids[0]) and alive(pids[1])  # gloo's enforce aborted rank 0's process
    assert_torn_down(coll, pids)


def test_a_real_forward_mismatch_is_reported_as_gloo_saw_it():
    coll = make_collective("torch", 2, timeout_s=TIMEOUT_S)
    pids = coll.pids
    coll.forward(1, {0: 4096, 1: 4096})
    # 3 vs 4 float32: one 4-byte ring segment each, so gloo checks nothing and the
    # rank with more segments waits for its peer: a hang, where the simulated backend
    # (modelling the GPU's NCCL all-reduce) says size_mismatch
    err = raises(coll.forward, 2, {0: 3, 1: 4})
    assert (err.kind, err.site, err.step) == ("hang", "forward", 2)
    assert is_gloo_timeout(err.line) and "numel differs across ranks: {0: 3, 1: 4}" in err.detail
    assert_torn_down(coll, pids)


# ----------------------------------------------------------------------------------
# torch: process hygiene
# ----------------------------------------------------------------------------------
def workers_of(pid: int) -> list[int]:
    """``pid``'s spawned multiprocessing children: the rank workers (not the resource
    tracker that spawning also starts, which exits on its own after its parent)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline") as f:
                    spawned = "spawn_main" in f.read()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if ppid == pid and spawned:
                out.append(int(entry))
    return out


def wait_until(cond, what: str, limit_s: float = 120.0):
    """Poll for a state change in another process; the limit only stops a broken test
    from hanging the suite."""
    end = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.05)


def test_ctrl_c_under_torch_is_one_line(tmp_path):
    cmd = [sys.executable, str(ROOT / "cli.py"), "run", str(ROOT / "scenarios" / "quickstart.yaml"),
           "-o", str(tmp_path / "r"), "--quiet", "--collective", "torch",
           "--set", "tp=2", "--set", "workload.num_requests=5000"]
    # its own session, so that the SIGINT goes to the whole process group as a
    # terminal's Ctrl-C does: the CLI and both workers
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        workers = []

        def group_up():
            workers[:] = workers_of(proc.pid)
            return len(workers) >= 2 and len(listening(workers)) >= 2

        wait_until(group_up, "the torch workers' gloo sockets")
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "interrupted" in err
    assert not [p for p in workers if alive(p)]


def test_workers_die_with_their_parent():
    script = ("import os, signal, sys\n"
              "from sim.collectives import make_collective\n"
              "if __name__ == '__main__':\n"
              "    c = make_collective('torch', 2, timeout_s=2)\n"
              "    print(c._tmpdir, *c.pids, flush=True)\n"
              "    os.kill(os.getpid(), signal.SIGKILL)  # no close(), no atexit\n")
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr
    tmp, *pids = p.stdout.split()
    pids = [int(x) for x in pids]
    assert len(pids) == 2
    wait_until(lambda: not [q for q in pids if alive(q)], "the orphaned workers to exit")
    # they remove the group's files on their way out (the last one out may still be
    # removing them when the first is reaped)
    wait_until(lambda: not os.path.exists(tmp), "the orphaned workers to remove the group's files")


# ----------------------------------------------------------------------------------
# calls paired by order: a skipping rank's next call meets the others' pending one
# ----------------------------------------------------------------------------------
AR = lambda n, site="sync": C.Call("cpu", site, "all_reduce", n, "int64")  # noqa: E731
BC = C.REQUEST_BROADCAST

# (rank 0's call, rank 1's call) -> (kind, line) measured with real gloo at world 2
# (torch==2.13.0; each rank's outcome recorded, the line the lowest failing rank's)
MEASURED = [
    (AR(4), BC, "hang", "gloo_timeout"),            # both time out receiving
    (AR(3, "load_check"), BC, "hang", "gloo_timeout"),
    (AR(1, "write_check"), BC, "hang", "gloo_timeout"),
    (BC, AR(4), "hang", "gloo_send_timeout"),       # the broadcast's root waits to send
    (AR(1, "write_check"), AR(3, "load_check"), "hang", "gloo_send_timeout"),  # rank 0 returns
    (AR(4), AR(1, "write_check"), "hang", "gloo_timeout"),                     # rank 1 returns
]


@pytest.mark.parametrize("c0,c1,kind,key", MEASURED)
def test_pairing_follows_what_gloo_did(c0, c1, kind, key):
    assert C.pair_outcome({0: c0, 1: c1}, 2, "gloo") == (kind, key)


def test_equal_calls_from_other_sites_pair_silently_and_nccl_never_checks():
    assert C.pair_outcome({0: AR(3, "load_check"), 1: AR(3, "load_check")}, 2, "gloo")[0] == "ok"
    assert C.pair_outcome({0: AR(3, "load_check"), 1: AR(3, "sync")}, 2, "gloo")[0] == "misaligned"
    assert C.pair_outcome({0: AR(4), 1: AR(5)}, 2, "gloo") == ("size_mismatch", "gloo_size")
    assert C.pair_outcome({0: AR(4), 1: AR(5)}, 2, "nccl") == ("hang", "nccl_timeout")


def test_a_skip_names_each_ranks_pending_call():
    sim = SimulatedCollective(2, timeout_s=2)
    err = raises(sim.all_reduce_min, 7, "write_check", {0: [1]}, {1: AR(3, "load_check")})
    assert (err.kind, err.ranks_in, err.ranks_out, err.step) == ("hang", [0], [1], 7)
    assert err.pending == {0: AR(1, "write_check").as_dict(), 1: AR(3, "load_check").as_dict()}
    assert err.line == LINES["gloo_send_timeout"].format(ms=2000)
    err = raises(sim.forward, 8, {0: 96}, {1: BC})
    assert err.kind == "hang" and err.pending[1]["site"] == "request_broadcast"
    assert err.pending[0] == {"group": "device", "site": "forward", "op": "all_reduce",
                              "shape": [96], "dtype": "float32"}


@pytest.mark.parametrize("args", [
    ("write_check", {0: [1]}, {1: AR(3, "load_check")}),   # rank 1 skips: its load check pairs
    ("sync", {0: [0, 1, 5, -5]}, {1: BC}),                   # rank 1 is already in the broadcast
], ids=["write_check_meets_load_check", "sync_meets_request_broadcast"])
def test_a_skip_pairs_the_next_call_as_gloo_does(args):
    """The real gloo group gets each rank's own call, the skipping rank its next one:
    the simulated answer is what it did."""
    coll = make_collective("torch", 2, timeout_s=TIMEOUT_S)
    pids = coll.pids
    try:
        coll.all_reduce_min(1, "sync", {0: [1, -1], 1: [2, -2]})
        err = raises(coll.all_reduce_min, 2, *args)
        ref = SimulatedCollective(2, timeout_s=TIMEOUT_S)
        ref.all_reduce_min(1, "sync", {0: [1, -1], 1: [2, -2]})
        sim = raises(ref.all_reduce_min, 2, *args)
        assert (err.kind, err.pending, err.detail) == (sim.kind, sim.pending, sim.detail)
        assert err.line == sim.line
    finally:
        assert_torn_down(coll, pids)


def test_an_idle_rank_blocks_in_the_request_broadcast_under_gloo():
    coll = make_collective("torch", 2, timeout_s=TIMEOUT_S)
    pids = coll.pids
    try:
        coll.forward(1, {0: 64, 1: 64})
        err = raises(coll.forward, 2, {0: 64}, {1: BC})
        ref = SimulatedCollective(2)
        ref.forward(1, {0: 64, 1: 64})
        sim = raises(ref.forward, 2, {0: 64}, {1: BC})
        assert (err.kind, err.pending, err.detail) == ("hang", sim.pending, sim.detail)
        assert is_gloo_timeout(err.line)
    finally:
        assert_torn_down(coll, pids)


def test_a_call_by_replica_is_the_per_rank_call():
    """``all_reduce_replicas`` (the sync's call when each replica's ranks agree):
    the result, the call log and the failures of ``all_reduce_min`` over the same
    vectors rank by rank."""
    groups = [([0, 3], [4, 1, 9, -9]), ([1], [2, 5, 9, -9]), ([2], [7, 0, 9, -9])]
    per_rank = {r: v for ranks, v in groups for r in ranks}
    a, b = SimulatedCollective(4), SimulatedCollective(4)
    assert a.all_reduce_replicas(3, "sync", groups) == b.all_reduce_min(3, "sync", per_rank) \
        == [2, 0, 9, -9]
    assert list(a.log) == list(b.log) and a.calls == b.calls == 1
    # a rank outside every group skipped the call: the same hang
    short = groups[:2]
    ea = raises(a.all_reduce_replicas, 4, "sync", short)
    eb = raises(b.all_reduce_min, 4, "sync", {r: v for ranks, v in short for r in ranks})
    assert (ea.kind, ea.ranks_out, str(ea)) == (eb.kind, eb.ranks_out, str(eb)) == \
        ("hang", [2], str(eb))
    # vectors of different sizes: the same size mismatch
    odd = [([0, 1, 2], [1, 1, 1, -1]), ([3], [1, 1, 1])]
    ea = raises(a.all_reduce_replicas, 5, "sync", odd)
    eb = raises(b.all_reduce_min, 5, "sync", {r: v for ranks, v in odd for r in ranks})
    assert (ea.kind, str(ea)) == (eb.kind, str(eb)) and ea.kind == "size_mismatch"
    assert list(a.log) == list(b.log)
