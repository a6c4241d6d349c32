"""Every knob in the scenario schema changes the run, or says why it does not.

The project's rule: a key in the scenario schema changes what a run does, or it is
not in the schema. This tool holds every leaf key of ``sim.scenario.Scenario`` (each
field of every section and of every variant of its unions, named ``Owner.field`` by
the class that declares it) to that rule. Each key has one entry in ``RULES``:

* ``Changes(context, alts)``: the key is set to each alternative value in a small run
  of ``context``, and each must change what the run did;
* ``Same(why, context, alts)``: the key does not change what the run did, by design
  (bookkeeping, a name, an execution choice whose results are identical by
  construction); each alternative is run too, and must give the same behaviour;
* ``Elsewhere(why)``: the key is held to the rule by a named test elsewhere (a
  scripted fault's step clock, a distribution's parameters in the sampler's tests).

"What the run did" is what the run wrote, less what merely echoes the configuration:
``requests.parquet``, ``timeseries.parquet``, ``divergence.json``, the op-traces of
every replica, any trace file it wrote, and ``summary.json`` without its echoed
capacities. A refused alternative (a UserError) is a failure of the audit: the entry
must give values the schema takes.

    python tools/knob_audit.py              # every entry; exit 1 naming each violation
    python tools/knob_audit.py -k storage   # the entries whose key contains "storage"

``tests/test_knob_audit.py`` runs every entry, one test each, and checks that
``RULES`` names exactly the schema's leaves: a new key fails until it has an entry.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import sys
import tempfile
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Arrival files for TraceArrival (format lines), passed as a trace root.
KNOB_DATA = ROOT / "tests" / "data" / "knobs"

# summary.json keys that restate the configuration rather than report the run
ECHOED = ("bytes_per_token", "device_gb", "host_gb", "device_tokens", "host_tokens", "dp")


@dataclass(frozen=True)
class Context:
    """A small run: a shipped scenario (under scenarios/), extra ``--set`` items, and
    the requests it is cut to (``limits.max_requests``)."""

    scenario: str
    sets: tuple = ()
    requests: int = 40


CHAT_FEW = "workload={kind: few_shot, num_requests: 40, num_templates: 3, arrival: {process: poisson, rate: 4}}"
CHAT_AGENT = ("workload={kind: agentic_tool_loop, num_requests: 40, arrival: {process: poisson, rate: 1},"
              " shared_prefix_tokens: 2048, task_tokens: {dist: lognormal, mean: 300, cv: 0.5},"
              " steps: {dist: lognormal, mean: 4, cv: 1.0}, step_tokens: {dist: lognormal, mean: 200, cv: 1.0},"
              " output_tokens: {dist: lognormal, mean: 60, cv: 1.0}}")
CHAT_UNIFORM = ("workload={kind: uniform, num_requests: 40, arrival: {process: poisson, rate: 4},"
                " input_tokens: {dist: uniform, low: 256, high: 4096}}")
MIX = ("workload={kind: mix, parts: [{kind: few_shot, num_requests: 20, num_templates: 3,"
       " arrival: {process: poisson, rate: 4}}, {kind: uniform, num_requests: 20,"
       " arrival: {process: poisson, rate: 2}, input_tokens: {dist: uniform, low: 256, high: 2048}}]}")
MOONCAKE = "traces/mooncake-fast25/conversation_trace.jsonl.gz"
AGENTIC = "traces/weka-claude-code-subset"

CONTEXTS = {
    "quick": Context("quickstart.yaml"),
    "wb": Context("quickstart.yaml", ("cache.write_policy=write_back",)),
    "press": Context("host_pressure_reclaim.yaml", requests=60),
    "swa": Context("hybrid_swa.yaml"),
    "swa_host": Context("hybrid_swa_host.yaml"),
    "mamba": Context("hybrid_mamba.yaml", requests=30),
    "mla": Context("deepseek_mla_dedup.yaml"),
    "storage": Context("storage_mooncake.yaml"),
    "buffer": Context("storage_buffer_only.yaml"),
    "slow": Context("storage_slow_rank.yaml"),
    "dp": Context("quickstart.yaml", ("dp=2", "router.policy=cache_aware")),
    "steps": Context("regressions/sglang_26921.yaml", requests=60),
    "zipf": Context("capacity_wb_vs_wt.yaml"),
    "few": Context("quickstart.yaml", (CHAT_FEW,)),
    "agent": Context("quickstart.yaml", (CHAT_AGENT,)),
    "uniform": Context("quickstart.yaml", (CHAT_UNIFORM,)),
    "mix": Context("quickstart.yaml", (MIX,)),
    "bursty": Context("quickstart.yaml", ("workload.arrival={process: bursty, rate: 1.0}",)),
    "lines": Context("quickstart.yaml", ("workload.arrival={process: trace, path: arrivals.lines}",)),
    "mooncake": Context("mooncake_conversation.yaml", ("dp=1",), requests=40),
    "agentic": Context("agentic_claude_code.yaml", ("tp=2",), requests=6),
    "generic": Context("regressions/lmcache_1467.yaml", requests=60),
    "ack": Context("jitter_ack_delay.yaml"),
    "alloc": Context("jitter_host_alloc_failure.yaml", requests=120),
    "free": Context("jitter_device_free_delay.yaml"),
    "drift": Context("jitter_id_drift.yaml", requests=140),
    "order": Context("jitter_request_order.yaml", requests=160),
    "hskew": Context("jitter_host_capacity_skew.yaml"),
    "dskew": Context("jitter_device_capacity_skew.yaml"),
    "wtfail": Context("jitter_write_through_alloc_failure.yaml"),
    "node": Context("quickstart.yaml", ("node={host_ram_gb: 64, on_exceed: warn}",)),
    # write_through: write acks exist (write_back's eviction backups complete at once)
    "ack_wt": Context("jitter_ack_delay.yaml", ("cache.write_policy=write_through",)),
    # cache_aware with no absolute gap: the relative threshold alone decides balance
    "dp0": Context("quickstart.yaml", ("dp=2", "router.policy=cache_aware",
                                       "router.balance_abs_threshold=0", "workload.arrival.rate=20"),
                   requests=80),
    # MLA under attention context parallelism (sglang #37149): which ranks write
    "cp": Context("regressions/sglang_37149.yaml"),
    # prompts past the chunked-prefill size
    "long": Context("quickstart.yaml", ("workload.system_prompt_tokens=12000",)),
    # arrivals faster than service: a waiting queue for the schedule policies to order
    "busy": Context("quickstart.yaml", ("workload.arrival.rate=20",), requests=80),
    # generic rows without block_size (the trace's applies), and content-named blocks
    "nobs": Context("regressions/lmcache_1467.yaml",
                    ("workload.path=no_block_size.jsonl", "workload.block_size=32")),
    # arrivals in bursts: prefill batches of several requests to cap and order
    "burst": Context("quickstart.yaml", ("workload.arrival={process: bursty, rate: 40, cv: 8}",),
                     requests=80),
    # the scheduler at its defaults (no key of it set)
    "plain": Context(str(KNOB_DATA / "plain.yaml")),
    # swaps within batches of several candidates
    "order_burst": Context("jitter_request_order.yaml", (
        "jitter.request_order.swap_probability=0.9",
        "workload.arrival={process: bursty, rate: 40, cv: 8}"), requests=120),
    # perturbations that fire often enough to split the ranks in a short run
    "alloc_hi": Context("jitter_host_alloc_failure.yaml", ("jitter.host_alloc_failure.probability=0.3",),
                        requests=120),
    "order_hi": Context("jitter_request_order.yaml", ("jitter.request_order.swap_probability=0.9",),
                        requests=160),
    "content": Context("regressions/lmcache_1467.yaml", ("workload.path=content_ids.jsonl",)),
}


@dataclass(frozen=True)
class Changes:
    """Each alternative (a tuple of ``--set`` items) changes what ``context`` did."""

    context: str
    alts: tuple

    def __init__(self, context: str, *alts):
        object.__setattr__(self, "context", context)
        object.__setattr__(self, "alts", tuple(_alt(a) for a in alts))


@dataclass(frozen=True)
class Same:
    """Each alternative leaves what ``context`` did unchanged, for the reason ``why``."""

    why: str
    context: str
    alts: tuple

    def __init__(self, why: str, context: str, *alts):
        object.__setattr__(self, "why", why)
        object.__setattr__(self, "context", context)
        object.__setattr__(self, "alts", tuple(_alt(a) for a in alts))


@dataclass(frozen=True)
class Elsewhere:
    """Held to the rule by the test ``why`` names."""

    why: str


def _alt(a) -> tuple:
    return (a,) if isinstance(a, str) else tuple(a)


TIMEOUT_SAME = ("the torch backend's wait before a blocked call is reported as a hang; "
                "a simulated collective never blocks (tests/test_torch_outcomes.py holds "
                "torch and simulated runs to the same outcome)")

RULES: dict[str, object] = {
    # -- the scenario
    "Scenario.name": Same("names the run and its default results folder", "quick", "name=other"),
    "Scenario.description": Same("free text", "quick", "description=other words"),
    "Scenario.seed": Changes("quick", "seed=2"),
    "Scenario.tp": Changes("quick", "tp=1", "tp=4"),
    "Scenario.dp": Changes("quick", "dp=2"),
    "Scenario.page_size": Changes("quick", ["page_size=16", "device.tokens=16384"]),
    "Scenario.on_divergence": Changes("drift", "on_divergence=record"),
    # -- the model
    "ModelConfig.preset": Changes("quick", "model.preset=qwen3-32b"),
    "ModelConfig.hybrid_preset": Changes("swa", "model.hybrid_preset=gpt-oss-120b"),
    "ModelConfig.layers": Changes("quick", "model.layers=16"),
    "ModelConfig.q_heads": Changes("quick", "model.q_heads=64"),
    "ModelConfig.kv_heads": Changes("quick", "model.kv_heads=4"),
    "ModelConfig.head_dim": Changes("quick", "model.head_dim=64"),
    "ModelConfig.v_head_dim": Changes("quick", "model.v_head_dim=64"),
    "ModelConfig.dtype_bytes": Changes("quick", "model.dtype_bytes=1"),
    "Mla.kv_lora_rank": Changes("mla", "model.mla={kv_lora_rank: 256, qk_rope_head_dim: 64}"),
    "Mla.qk_rope_head_dim": Changes("mla", "model.mla={kv_lora_rank: 512, qk_rope_head_dim: 32}"),
    "ModelConfig.params_b": Changes("quick", "model.params_b=70"),
    "ModelConfig.total_params_b": Changes("quick", "model.total_params_b=70"),
    "ModelConfig.weight_bytes": Changes("quick", "model.weight_bytes=1"),
    # -- capacities
    "Device.tokens": Changes("quick", "device.tokens=8192"),
    "Device.gib": Changes("quick", "device.gib=1"),
    "Device.mem_fraction_static": Changes("quick", "device.mem_fraction_static=0.5",
                                          "device.mem_fraction_static=auto"),
    "Device.swa_full_tokens_ratio": Changes("swa", "device.swa_full_tokens_ratio=0.4"),
    "Device.mamba_full_memory_ratio": Changes("mamba", ["device={gib: 2, mamba_full_memory_ratio: 0.5}"]),
    "Device.max_mamba_cache_size": Changes("mamba", "device.max_mamba_cache_size=8"),
    "Host.tokens": Changes("quick", "host.tokens=8192", "host.tokens=0"),
    "Host.gib": Changes("quick", "host.gib=0.5"),
    "Host.ratio": Changes("quick", "host.ratio=1.0"),
    "Host.size_gb": Changes("quick", "host.size_gb=0.5"),
    "Host.host_memory_fraction": Changes("node", ["node.host_ram_gb=12", "host.host_memory_fraction=0.5"]),
    "Host.mamba_states": Changes("mamba", "host.mamba_states=4"),
    "Host.swa_tokens": Changes("swa_host", "host.swa_tokens=2048"),
    "Host.mla_dedup": Changes("mla", "host.mla_dedup=true"),
    "Node.host_ram_gb": Changes("node", "node.host_ram_gb=1"),
    "Node.gpus": Changes("node", ["node.host_ram_gb=12", "node.gpus=2"]),
    "Node.on_exceed": Elsewhere("refuse stops a run before it starts, which warn runs anyway: "
                                "tests/test_sizing.py"),
    # -- the cache
    "Cache.write_policy": Changes("quick", "cache.write_policy=write_through",
                                  "cache.write_policy=write_through_selective"),
    "Cache.host_policy": Changes("press", "cache.host_policy=lru", "cache.host_policy=duplicate_first_single_pass",
                                 "cache.host_policy=duplicate_first_by_id"),
    "Cache.eviction_policy": Changes("quick", "cache.eviction_policy=lfu", "cache.eviction_policy=fifo",
                                     "cache.eviction_policy=mru", "cache.eviction_policy=filo",
                                     "cache.eviction_policy=priority"),
    "Cache.load_back_threshold": Changes("quick", "cache.load_back_threshold=4096"),
    "Cache.tree_core": Changes("press", "cache.tree_core=python"),
    "Cache.ids": Changes("press", "cache.ids=sglang", "cache.ids=optrace"),
    "Cache.release_prefill_swa": Changes("swa", "cache.release_prefill_swa=true"),
    # -- costs
    "Cost.profile": Changes("quick", "cost.profile=a100"),
    "Cost.io_backend": Changes("quick", "cost.io_backend=direct"),
    "Cost.mem_layout": Changes("quick", "cost.mem_layout=layer_first"),
    # -- collectives
    "Collective.backend": Same("torch runs the same reductions through torch.distributed (gloo "
                               "here), one process per rank: the same results",
                               "quick", "collective.backend=torch"),
    "Collective.device": Changes("quick", "collective.device=cuda"),
    "Collective.discipline": Changes("ack_wt", "collective.discipline=pre_26921", "collective.discipline=local"),
    "Collective.timeout_s": Same(TIMEOUT_SAME, "ack", "collective.timeout_s=1"),
    "Collective.forward": Changes("order", "collective.forward=none"),
    "Collective.rank_consensus": Changes("alloc_hi", "collective.rank_consensus=true"),
    # -- the router
    "Router.policy": Changes("quick", ["dp=2", "router.policy=least_load"],
                             ["dp=2", "router.policy=cache_aware"]),
    "Router.cache_threshold": Changes("dp", "router.cache_threshold=0.9"),
    "Router.balance_abs_threshold": Changes("dp", "router.balance_abs_threshold=0"),
    "Router.balance_rel_threshold": Changes("dp0", "router.balance_rel_threshold=4.0"),
    "Router.max_tree_tokens": Changes("dp", "router.max_tree_tokens=256"),
    # -- the engine's bookkeeping
    "Engine.replicas": Same("one tree per rank or shared until a fork: bookkeeping, "
                            "byte-identical by construction", "ack", "engine.replicas=eager"),
    "Engine.decode_runs": Same("decode runs priced at once or step by step: bookkeeping, "
                               "byte-identical by construction", "quick", "engine.decode_runs=false"),
    "Engine.check_invariants": Same("recomputes the ledgers and stops on a broken one: "
                                    "a check, not a model", "quick", "engine.check_invariants=true"),
    "Engine.clock": Changes("generic", "engine={clock: time}"),
    "AckDelaySteps.d2h": Changes("steps", "engine.ack_delay_steps.d2h=3"),
    "AckDelaySteps.h2d": Changes("generic", "engine.ack_delay_steps.h2d=3"),
    # -- storage
    "Storage.backend": Changes("storage", "storage.backend=file", "storage.backend=3fs",
                               "storage.backend=nixl", "storage.backend=sim"),
    "Storage.read_gbps": Changes("storage", "storage.read_gbps=0.5"),
    "Storage.write_gbps": Changes("storage", "storage.write_gbps=0.5"),
    "Storage.op_latency_us": Changes("storage", "storage.op_latency_us=5000"),
    "Storage.capacity_gb": Changes("storage", "storage.capacity_gb=0.05"),
    "Storage.prefetch_policy": Changes("storage", "storage.prefetch_policy=best_effort",
                                       "storage.prefetch_policy=wait_complete"),
    "Storage.prefetch_threshold": Changes("storage", "storage.prefetch_threshold=4096"),
    "Storage.prefetch_timeout_base": Changes("slow", "storage.prefetch_timeout_base=0.001"),
    "Storage.prefetch_timeout_per_ki_token": Changes("slow", "storage.prefetch_timeout_per_ki_token=0.05"),
    "Storage.attn_cp_size": Changes("cp", "storage.attn_cp_size=1"),
    "Storage.host_memory_mode": Changes("storage", "storage.host_memory_mode=buffer_only"),
    # -- jitter
    "Jitter.seed": Changes("alloc", "jitter.seed=99"),
    "AckDelay.dist": Changes("ack", "jitter.ack_delay={dist: uniform, low: 0.0, high: 0.01}",
                             "jitter.ack_delay={dist: lognormal, mean: 0.005, cv: 1.0}",
                             "jitter.ack_delay={dist: none}"),
    "AckDelay.ranks": Changes("ack_wt", "jitter.ack_delay.ranks=[0]"),
    "AckDelay.acks": Changes("ack_wt", "jitter.ack_delay.acks=write", "jitter.ack_delay.acks=load"),
    "_DistFields.value": Elsewhere("a distribution's parameters draw what the sampler's tests say: "
                                   "tests/test_knob_audit.py::test_every_distribution_parameter_moves_the_draws"),
    "_DistFields.low": Elsewhere("tests/test_knob_audit.py::test_every_distribution_parameter_moves_the_draws"),
    "_DistFields.high": Elsewhere("tests/test_knob_audit.py::test_every_distribution_parameter_moves_the_draws"),
    "_DistFields.mean": Elsewhere("tests/test_knob_audit.py::test_every_distribution_parameter_moves_the_draws"),
    "_DistFields.cv": Elsewhere("tests/test_knob_audit.py::test_every_distribution_parameter_moves_the_draws"),
    "Dist.dist": Changes("quick", "workload.output_tokens={dist: constant, value: 256}",
                         "workload.output_tokens={dist: uniform, low: 1, high: 512}",
                         "workload.output_tokens={dist: exponential, mean: 256}"),
    "HostAllocFailure.probability": Changes("alloc", "jitter.host_alloc_failure.probability=0.9"),
    "HostAllocFailure.ranks": Changes("alloc", "jitter.host_alloc_failure.ranks=[0]"),
    "Jitter.host_capacity_skew": Changes("hskew", "jitter.host_capacity_skew={1: -4096}"),
    "Jitter.device_capacity_skew": Changes("dskew", "jitter.device_capacity_skew={1: -4096}"),
    "DeviceFreeDelay.dist": Changes("free", "jitter.device_free_delay={dist: none}",
                                    "jitter.device_free_delay={dist: uniform, low: 0.0, high: 0.5}"),
    "DeviceFreeDelay.ranks": Changes("free", "jitter.device_free_delay.ranks=[0]"),
    "IdDrift.rank": Changes("drift", "jitter.id_drift.rank=0"),
    "IdDrift.extra_ids": Changes("drift", "jitter.id_drift.extra_ids=7"),
    "IdDrift.after_request": Changes("drift", "jitter.id_drift.after_request=20"),
    "RequestOrder.ranks": Changes("order_hi", "jitter.request_order.ranks=[0]"),
    "RequestOrder.swap_probability": Changes("order", "jitter.request_order.swap_probability=0.9"),
    "RequestOrder.window": Changes("order_burst", "jitter.request_order.window=8"),
    "StorageMiss.probability": Changes("storage", "jitter.storage_miss.probability=0.5"),
    "StorageMiss.ranks": Changes("storage", "jitter.storage_miss.ranks=[0]"),
    "StorageFail.ranks": Changes("storage", "jitter.storage_fail.ranks=[1]"),
    "StorageLatency.factor": Changes("slow", "jitter.storage_latency.factor=1.0"),
    "StorageLatency.dist": Changes("slow", "jitter.storage_latency={dist: exponential, mean: 0.01, factor: 4.0, ranks: [1]}"),
    # every rank slow, against rank 1 alone (which one rank is slow is symmetric: each
    # rank waits for the slowest through the rank-agreed MIN of hits and progress)
    "StorageLatency.ranks": Changes("slow", "jitter.storage_latency.ranks=null"),
    # -- scripted faults (the step clock)
    "Fault.rank": Elsewhere("tests/test_faults.py::test_every_fault_knob_changes_the_run"),
    "Fault.kind": Elsewhere("tests/test_faults.py::test_every_fault_knob_changes_the_run"),
    "Fault.step": Elsewhere("tests/test_faults.py::test_every_fault_knob_changes_the_run"),
    "Fault.extra_steps": Elsewhere("tests/test_faults.py::test_every_fault_knob_changes_the_run"),
    # -- workloads: what every generator shares
    "_Generator.block_size": Changes("quick", "workload.block_size=16"),
    "_Generator.num_requests": Changes("quick", ["workload.num_requests=20"]),
    "_Generator.rate_scale": Changes("quick", "workload.rate_scale=4"),
    "_Generator.output_tokens": Changes("quick", "workload.output_tokens={dist: lognormal, mean: 32, cv: 1.0}"),
    "Poisson.process": Changes("quick", "workload.arrival={process: bursty, rate: 1.0}"),
    "Poisson.rate": Changes("quick", "workload.arrival.rate=4"),
    "Bursty.process": Changes("bursty", "workload.arrival={process: poisson, rate: 1.0}"),
    "Bursty.rate": Changes("bursty", "workload.arrival.rate=4"),
    "Bursty.cv": Changes("bursty", "workload.arrival.cv=8"),
    "TraceArrival.process": Changes("lines", "workload.arrival={process: poisson, rate: 1.0}"),
    "TraceArrival.path": Changes("lines", "workload.arrival.path=arrivals_fast.lines"),
    "TraceArrival.format": Changes("lines", ["workload.arrival.path=" + MOONCAKE,
                                             "workload.arrival.format=mooncake"]),
    "TraceArrival.skip_bad_lines": Changes("lines", ["workload.arrival.path=arrivals_bad.lines",
                                                     "workload.arrival.skip_bad_lines=true"]),
    # -- each generator's own keys
    "MultiTurnChat.kind": Changes("quick", CHAT_FEW),
    "MultiTurnChat.num_system_prompts": Changes("quick", "workload.num_system_prompts=1"),
    "MultiTurnChat.system_prompt_tokens": Changes("quick", "workload.system_prompt_tokens=128"),
    "MultiTurnChat.turns": Changes("quick", "workload.turns={dist: exponential, mean: 1.5}"),
    "MultiTurnChat.user_tokens": Changes("quick", "workload.user_tokens={dist: lognormal, mean: 800, cv: 1.0}"),
    "MultiTurnChat.think_time_s": Changes("quick", "workload.think_time_s={dist: exponential, mean: 2}"),
    "MultiTurnChat.max_context_tokens": Changes("quick", "workload.max_context_tokens=2048"),
    "AgenticToolLoop.kind": Changes("agent", CHAT_FEW),
    "AgenticToolLoop.num_shared_prefixes": Changes("agent", "workload.num_shared_prefixes=4"),
    "AgenticToolLoop.shared_prefix_tokens": Changes("agent", "workload.shared_prefix_tokens=256"),
    "AgenticToolLoop.task_tokens": Changes("agent", "workload.task_tokens={dist: constant, value: 2000}"),
    "AgenticToolLoop.steps": Changes("agent", "workload.steps={dist: constant, value: 1}"),
    "AgenticToolLoop.step_tokens": Changes("agent", "workload.step_tokens={dist: constant, value: 1000}"),
    "AgenticToolLoop.tool_time_s": Changes("agent", "workload.tool_time_s={dist: exponential, mean: 20}"),
    "AgenticToolLoop.max_context_tokens": Changes("agent", "workload.max_context_tokens=3072"),
    "AgenticToolLoop.output_tokens": Changes("agent", "workload.output_tokens={dist: constant, value: 8}"),
    "FewShot.kind": Changes("few", CHAT_UNIFORM),
    "FewShot.num_templates": Changes("few", "workload.num_templates=1"),
    "FewShot.template_tokens": Changes("few", "workload.template_tokens=512"),
    "FewShot.template_zipf_s": Changes("few", "workload.template_zipf_s=2.0"),
    "FewShot.suffix_tokens": Changes("few", "workload.suffix_tokens={dist: constant, value: 64}"),
    "ZipfDocuments.kind": Changes("zipf", CHAT_UNIFORM),
    "ZipfDocuments.num_documents": Changes("zipf", "workload.num_documents=5"),
    "ZipfDocuments.document_tokens": Changes("zipf", "workload.document_tokens={dist: constant, value: 512}"),
    "ZipfDocuments.zipf_s": Changes("zipf", "workload.zipf_s=2.0"),
    "ZipfDocuments.system_prompt_tokens": Changes("zipf", "workload.system_prompt_tokens=2048"),
    "ZipfDocuments.question_tokens": Changes("zipf", "workload.question_tokens={dist: constant, value: 512}"),
    "Uniform.kind": Changes("uniform", CHAT_FEW),
    "Uniform.input_tokens": Changes("uniform", "workload.input_tokens={dist: constant, value: 1024}"),
    # -- traces
    "Trace.kind": Changes("mooncake", CHAT_FEW),
    "Trace.format": Changes("generic", ["workload.format=mooncake", "workload.path=" + MOONCAKE,
                                        "workload.block_size=512", "engine={clock: time}"]),
    "Trace.path": Changes("generic", "workload.path=tp2_hostpress.jsonl"),
    "Trace.rate_scale": Changes("mooncake", "workload.rate_scale=4"),
    "Trace.skip_bad_lines": Changes("generic", ["workload.path=" + str(KNOB_DATA / "bad_line.jsonl"),
                                                "workload.skip_bad_lines=true"]),
    "Trace.block_size": Changes("nobs", "workload.block_size=48"),
    "Trace.block_ids": Changes("content", "workload.block_ids=content"),
    "ConversationStart.mode": Changes("agentic", "workload.conversation_start={mode: poisson, rate: 0.5}"),
    "ConversationStart.rate": Changes("agentic", ["workload.conversation_start={mode: poisson, rate: 0.5}"]),
    "Mix.kind": Changes("mix", CHAT_FEW),
    # -- the scheduler
    "Scheduler.mode": Changes("plain", "scheduler.mode=cache_replay"),
    "Scheduler.max_running_requests": Changes("quick", "scheduler.max_running_requests=2"),
    "Scheduler.chunked_prefill_tokens": Changes("long", "scheduler.chunked_prefill_tokens=512",
                                                "scheduler.chunked_prefill_tokens=null"),
    "Scheduler.max_prefill_tokens": Changes("burst", "scheduler.max_prefill_tokens=2048"),
    "Scheduler.schedule_conservativeness": Changes("quick", ["device.tokens=8192",
                                                             "scheduler.schedule_conservativeness=0.3"]),
    "Scheduler.decode": Changes("quick", "scheduler.decode=false"),
    "Scheduler.schedule_policy": Changes("burst", "scheduler.schedule_policy=lpm", "scheduler.schedule_policy=dfs-weight",
                                         "scheduler.schedule_policy=lof", "scheduler.schedule_policy=random"),
    "Scheduler.clip_max_new_tokens": Changes("quick", ["device.tokens=8192", "scheduler.clip_max_new_tokens=16"]),
    "Scheduler.ignore_eos": Changes("quick", ["device.tokens=8192", "scheduler.ignore_eos=true"]),
    "Scheduler.overlap": Changes("quick", "scheduler.overlap=false"),
    "Scheduler.overlap_timing": Changes("quick", "scheduler.overlap_timing=serial"),
    # -- limits and output
    "Limits.max_requests": Changes("quick", "limits.max_requests=20"),
    "Limits.duration_s": Changes("quick", "limits.duration_s=5"),
    "Output.timeseries_interval_s": Changes("quick", "output.timeseries_interval_s=0.25"),
    "Output.trace_out": Changes("quick", "output.trace_out=trace.json"),
}


# ------------------------------------------------------------------ the schema's leaves
def _flat(ann) -> list:
    out, stack = [], [ann]
    while stack:
        a = stack.pop()
        origin = typing.get_origin(a)
        if origin is typing.Annotated:
            stack.append(typing.get_args(a)[0])
        elif origin in (typing.Union, types.UnionType, list, dict):
            stack.extend(typing.get_args(a))
        else:
            out.append(a)
    return out


def _owner(model, name: str) -> type:
    for k in model.__mro__:
        if name in getattr(k, "__annotations__", {}):
            return k
    return model


def leaves() -> dict[str, str]:
    """Every leaf key of the schema, ``Owner.field`` -> one dotted path to it. A field
    whose type is a section is not a leaf (its fields are), except a distribution
    (``Dist``): a generator's distribution is a knob in its own right, and its
    parameters are ``_DistFields``' leaves."""
    from pydantic import BaseModel

    from sim.scenario import Dist, Scenario

    out: dict[str, str] = {}

    def walk(model, prefix: str) -> None:
        for name, f in model.model_fields.items():
            subs = [a for a in _flat(f.annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
            label = f"{_owner(model, name).__name__}.{name}"
            if Dist in subs:
                out.setdefault(label, prefix + name)
            if subs:
                for sub in subs:
                    walk(sub, prefix + name + ".")
            else:
                out.setdefault(label, prefix + name)

    walk(Scenario, "")
    return out


# ------------------------------------------------------------------ running an entry
def behaviour(context: Context, alt: tuple = ()) -> dict[str, str]:
    """``{file: sha256}`` of what a run of ``context`` (with ``alt`` set after its own
    items) did; a refused configuration raises its UserError."""
    from sim.runner import run_scenario
    from sim.scenario import load_scenario

    sets = [f"limits.max_requests={context.requests}", *context.sets, *alt]
    scn = load_scenario(ROOT / "scenarios" / context.scenario, sets, trace_roots=[str(KNOB_DATA)])
    with tempfile.TemporaryDirectory(prefix="knob_audit_") as tmp:
        res, ops = Path(tmp) / "results", Path(tmp) / "ops"
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            run_scenario(scn, res, record_ops_dir=ops)
        out = {}
        for folder, tag in ((res, "results/"), (ops, "ops/")):
            if not folder.exists():
                continue
            for p in sorted(q for q in folder.rglob("*") if q.is_file()):
                rel = tag + p.relative_to(folder).as_posix()
                if rel in ("results/scenario.yaml", "results/meta.json", "results/.lock"):
                    continue  # the configuration itself, and the run's provenance
                if rel == "ops/index.json":
                    continue  # which replica stood for which rank: bookkeeping
                data = p.read_bytes()
                if rel.startswith("ops/") and rel.endswith(".jsonl"):
                    # the header's note names the scenario and the replica's ranks
                    head, _, rest = data.partition(b"\n")
                    header = json.loads(head)
                    header.pop("note", None)
                    data = json.dumps(header, sort_keys=True).encode() + b"\n" + rest
                if rel == "results/summary.json":
                    summary = json.loads(data)
                    for k in ECHOED:
                        summary.pop(k, None)
                    data = json.dumps(summary, sort_keys=True).encode()
                out[rel] = hashlib.sha256(data).hexdigest()
        return out


_BASES: dict[str, dict] = {}


def base(name: str) -> dict[str, str]:
    if name not in _BASES:
        _BASES[name] = behaviour(CONTEXTS[name])
    return _BASES[name]


@dataclass
class Finding:
    key: str
    alt: tuple
    ok: bool
    detail: str = ""
    changed: list = field(default_factory=list)


def audit(key: str) -> list[Finding]:
    """Run ``key``'s entry; one finding per alternative."""
    from sim.errors import UserError

    rule = RULES[key]
    if isinstance(rule, Elsewhere):
        return [Finding(key, (), True, rule.why)]
    ref = base(rule.context)
    found = []
    for alt in rule.alts:
        try:
            got = behaviour(CONTEXTS[rule.context], alt)
        except UserError as e:
            found.append(Finding(key, alt, False, f"refused: {e}"))
            continue
        changed = sorted(k for k in set(ref) | set(got) if ref.get(k) != got.get(k))
        if isinstance(rule, Changes):
            found.append(Finding(key, alt, bool(changed),
                                 "" if changed else "the run did exactly what it did without it",
                                 changed))
        else:
            found.append(Finding(key, alt, not changed,
                                 f"changed {', '.join(changed)}" if changed else rule.why, changed))
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", dest="only", help="only the entries whose key contains this")
    ap.add_argument("--keys", help="only these entries (comma-separated keys)")
    args = ap.parse_args(argv)
    keys = set(args.keys.split(",")) if args.keys else None
    schema = leaves()
    bad = 0
    for k in sorted(set(schema) - set(RULES)):
        print(f"{k} ({schema[k]}): no entry in RULES")
        bad += 1
    for k in sorted(set(RULES) - set(schema)):
        print(f"{k}: an entry in RULES for a key the schema does not have")
        bad += 1
    for key in sorted(RULES):
        if (args.only and args.only not in key) or (keys is not None and key not in keys):
            continue
        for f in audit(key):
            mark = "ok " if f.ok else "BAD"
            what = " ".join(f.alt) or "-"
            print(f"{mark} {key}: {what}: {f.detail or ', '.join(f.changed)}", flush=True)
            bad += not f.ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
