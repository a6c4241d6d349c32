"""One run of SGLang's real server harness, as a config, and what it maps to.

A run config (one line of a manifest, written by gen_workloads.py) is a flat dict.
From it come both sides of a comparison:

* :func:`harness_args`: the flags of ``../shared/oracle/server/server_oracle.py``;
* :func:`engine_scenario`: the hicache-sim scenario (a dict, dumped as YAML) that
  runs the same trace under the engine's step clock.

Keys: ``run`` (the run's name), ``workload``, ``trace`` (a file name beside the
manifest), ``seed``, ``block_size``, ``write_policy``, ``overlap``, ``page_size``,
``device_tokens``, ``host_ratio``, ``max_running``, ``chunked_prefill_size`` (-1: no
chunking, as SGLang spells it), ``max_prefill_tokens``, ``schedule_policy``,
``schedule_conservativeness`` (null: SGLang's default), ``clip_max_new_tokens``
(null: SGLang's default, the env var unset), ``d2h_delay_steps``,
``h2d_delay_steps``, ``tree_core``; a TP-2 run (tools/sglang_server/tp2.py) adds
``tp``, ``fault`` (the harness's ``--fault`` spec, or null) and ``fault_rank``.

Where the server harness is: ``$HICACHE_SGLANG_SERVER``, else
``$HICACHE_SGLANG_ORACLE/server`` (the Makefile's ``SGLANG_ORACLE``), else
``../shared/oracle/server`` beside the repository, as tools/sglang_oracle resolves
the tree oracle. Its venv: ``$SGLANG_SERVER_VENV``, else ``sglang-server-venv`` in
the temp folder (what its setup.sh builds).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVER_ENV = "HICACHE_SGLANG_SERVER"
ORACLE_ENV = "HICACHE_SGLANG_ORACLE"
VENV_ENV = "SGLANG_SERVER_VENV"

# SGLang 0.5.23's default for SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
# (managers/schedule_policy.py, module-level CLIP_MAX_NEW_TOKENS), emitted explicitly
# in engine scenarios so both sides name the value they run with.
SGLANG_DEFAULT_CLIP = 4096
# Arrival steps also written as seconds (the generic trace's arrival_s) at this
# spacing, so the rows stay valid for the engine's time clock.
STEP_SECONDS = 0.02

WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random")
POLICY_TAG = {"write_back": "wb", "write_through": "wt", "write_through_selective": "wts"}

REQUIRED = ("run", "workload", "trace", "seed", "block_size", "write_policy", "overlap",
            "page_size", "device_tokens", "host_ratio", "max_running", "chunked_prefill_size",
            "max_prefill_tokens", "schedule_policy", "schedule_conservativeness",
            "clip_max_new_tokens", "d2h_delay_steps", "h2d_delay_steps", "tree_core")


class ConfigError(Exception):
    """A run config that is not usable: one line, what was found and what was expected."""


def server_dir() -> Path:
    env = os.environ.get(SERVER_ENV)
    if env:
        return Path(env)
    oracle = os.environ.get(ORACLE_ENV)
    if oracle:
        return Path(oracle) / "server"
    return REPO.parent / "shared" / "oracle" / "server"


def server_python() -> Path:
    venv = os.environ.get(VENV_ENV) or str(Path(tempfile.gettempdir()) / "sglang-server-venv")
    return Path(venv) / "bin" / "python"


def check_server() -> str | None:
    """None when the harness and its venv are there, else the one-line reason."""
    d = server_dir()
    if not (d / "server_oracle.py").is_file():
        return (f"{d}: found no server_oracle.py; expected SGLang's server harness "
                f"(../shared/oracle/server; set ${SERVER_ENV} or ${ORACLE_ENV})")
    py = server_python()
    if not py.is_file():
        return (f"{py}: found no server venv; expected one built by {d}/setup.sh "
                f"(set ${VENV_ENV})")
    return None


def validate(cfg: dict, where: str) -> None:
    missing = [k for k in REQUIRED if k not in cfg]
    if missing:
        raise ConfigError(f"{where}: found no {', '.join(missing)}; expected every run-config key")
    if cfg["write_policy"] not in WRITE_POLICIES:
        raise ConfigError(f"{where}: write_policy = {cfg['write_policy']!r}; expected one of "
                          f"{', '.join(WRITE_POLICIES)}")
    if cfg["schedule_policy"] not in SCHEDULE_POLICIES:
        raise ConfigError(f"{where}: schedule_policy = {cfg['schedule_policy']!r}; expected one of "
                          f"{', '.join(SCHEDULE_POLICIES)}")
    if cfg["device_tokens"] % cfg["page_size"]:
        raise ConfigError(f"{where}: device_tokens {cfg['device_tokens']} is not a multiple of "
                          f"page_size {cfg['page_size']}")


def harness_args(cfg: dict) -> list[str]:
    """server_oracle.py's flags for ``cfg`` (trace and -o not included)."""
    a = ["--hicache", "--hicache-write-policy", cfg["write_policy"],
         "--page-size", str(cfg["page_size"]), "--device-tokens", str(cfg["device_tokens"]),
         "--hicache-ratio", repr(float(cfg["host_ratio"])),
         "--max-running", str(cfg["max_running"]),
         "--chunked-prefill-size", str(cfg["chunked_prefill_size"]),
         "--max-prefill-tokens", str(cfg["max_prefill_tokens"]),
         "--schedule-policy", cfg["schedule_policy"],
         "--tree-core", cfg["tree_core"],
         "--d2h-delay-steps", str(cfg["d2h_delay_steps"]),
         "--h2d-delay-steps", str(cfg["h2d_delay_steps"]),
         "--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first",
         # ServerArgs.random_seed: the seed a real server gives set_random_seed, which
         # the `random` schedule policy's random.shuffle draws from (launch.py).
         "--extra-server-arg", f"random_seed={int(cfg['seed'])}"]
    if cfg["schedule_conservativeness"] is not None:
        a += ["--schedule-conservativeness", repr(float(cfg["schedule_conservativeness"]))]
    if cfg["clip_max_new_tokens"] is not None:
        a += ["--env", f"SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION={int(cfg['clip_max_new_tokens'])}"]
    if cfg["overlap"]:
        a.append("--overlap")
    return a


def env_group(cfg: dict) -> tuple:
    """What a process must have set before it imports SGLang (read at import time)."""
    return (cfg["tree_core"], cfg["clip_max_new_tokens"])


def engine_scenario(cfg: dict, trace_name: str) -> dict:
    """The hicache-sim scenario that runs ``cfg`` under the step clock.

    ``trace_name`` is relative to the folder the scenario file is written to.
    """
    chunk = cfg["chunked_prefill_size"]
    sched = {
        "max_running_requests": int(cfg["max_running"]),
        "chunked_prefill_tokens": None if chunk is None or chunk <= 0 else int(chunk),
        "max_prefill_tokens": int(cfg["max_prefill_tokens"]),
        "decode": True,
        # every harness request is sent with ignore_eos (its stub forward never emits EOS)
        "ignore_eos": True,
        "overlap": bool(cfg["overlap"]),
        "schedule_policy": cfg["schedule_policy"],
        "clip_max_new_tokens": int(cfg["clip_max_new_tokens"] or SGLANG_DEFAULT_CLIP),
    }
    if cfg["schedule_conservativeness"] is not None:
        sched["schedule_conservativeness"] = float(cfg["schedule_conservativeness"])
    return {
        "name": cfg["run"],
        "description": f"SGLang server harness run {cfg['run']} (tools/sglang_server)",
        "seed": int(cfg["seed"]),
        "model": {"preset": "llama-3.1-8b"},
        "tp": int(cfg.get("tp", 1)),
        "page_size": int(cfg["page_size"]),
        "device": {"tokens": int(cfg["device_tokens"])},
        "host": {"ratio": float(cfg["host_ratio"])},
        "cache": {"write_policy": cfg["write_policy"], "tree_core": cfg["tree_core"],
                  "eviction_policy": "lru", "ids": "server"},
        "cost": {"io_backend": "direct", "mem_layout": "layer_first"},
        "engine": {"clock": "steps",
                   "ack_delay_steps": {"d2h": int(cfg["d2h_delay_steps"]),
                                       "h2d": int(cfg["h2d_delay_steps"])}},
        "workload": {"kind": "trace", "format": "generic", "path": trace_name,
                     "block_size": int(cfg["block_size"])},
        "scheduler": sched,
        **({"faults": [engine_fault(cfg["fault"], int(cfg.get("fault_rank", 1)))]}
           if cfg.get("fault") else {}),
        # the harness's forward is a stub with no collective (server_oracle.py
        # install_forward): ranks whose batches differ do not meet in it
        **({"collective": {"forward": "none"}} if int(cfg.get("tp", 1)) > 1 else {}),
    }


def engine_fault(spec: str, rank: int) -> dict:
    """A harness ``--fault`` spec (``host_alloc_fail@K``, ``ack_delay@K:E``,
    ``reclaim_skip@K``; instrument.py ``_install_fault``) as the scenario's fault."""
    kind, _, rest = spec.partition("@")
    step, _, extra = rest.partition(":")
    f = {"rank": rank, "kind": kind, "step": int(step)}
    if extra:
        f["extra_steps"] = int(extra)
    return f


def run_key(cfg: dict, trace_bytes: bytes, harness_files: dict[str, bytes]) -> str:
    """A short hash of everything a harness output depends on: the config, the trace
    and the harness's own code (a changed harness makes cached outputs stale)."""
    h = hashlib.sha256()
    h.update(json.dumps(harness_args(cfg)).encode())
    h.update(b"\0trace\0" + trace_bytes)
    for name in sorted(harness_files):
        h.update(b"\0" + name.encode() + b"\0" + harness_files[name])
    return h.hexdigest()[:12]


def harness_files() -> dict[str, bytes]:
    """The harness's Python sources and this folder's launcher, by name. (zygote.py
    only forks: run_harness.py --verify-fresh checks it changes no output.)"""
    d = server_dir()
    files = {p.name: p.read_bytes() for p in sorted(d.glob("*.py"))}
    files["tools/launch.py"] = (Path(__file__).resolve().parent / "launch.py").read_bytes()
    return files
