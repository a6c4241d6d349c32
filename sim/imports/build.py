"""A dump -> a scenario (``scenario.yaml``) and its trace (``trace.jsonl``, generic).

The trace holds one record per request, in arrival order: ``arrival_s`` (the
request's ``created`` time, from the first one), ``input_len``, ``output_len`` (the
output tokens it produced: all of them for a finished request, those before the crash
for one in flight), ``block_size`` (the server's page size) and ``blocks``: one
*prefix* id per full page of its token ids, a chained hash of the tokens up to and
including that page. Equal ids therefore mean equal token prefixes, as SGLang's radix
tree keys them (page-aligned; the partial tail page is never shared: the reader adds a
fresh id for it). The token ids themselves, the server's ``cached_tokens`` and the rid
ride along as extra fields (``input_ids``, ``cached_tokens``, ``rid``) that the generic
reader ignores, so the trace stays the server's traffic in full.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import yaml

from sim import atomic
from sim.constants import ATTENTION_ARCH_MLA
from sim.errors import UserError, one_line
from sim.imports.crashdump import Dump
from sim.imports.server_args import map_server_args
from sim.paths import SLUG_RULE, is_slug

# Bytes of a torch dtype (the ModelConfig's dtype / --kv-cache-dtype).
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
                "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
                "fp4_e2m1": 1}


def _n(mc, key):
    v = mc.get(key) if mc is not None else None
    return v if type(v) is int and v > 0 else None


def model_from_dump(dump: Dump) -> tuple[dict | None, str]:
    """The scenario's ``model`` section from the dump's resolved ModelConfig, or None.

    ``ModelConfig`` (configs/model_config.py) carries the geometry the KV pool is sized
    from: ``num_attention_layers``, ``num_attention_heads``, ``num_key_value_heads``,
    ``head_dim`` / ``v_head_dim``, and for MLA ``kv_lora_rank`` + ``qk_rope_head_dim``.
    Parameters are estimated from the HuggingFace config (for compute costs only).
    """
    mc = dump.model_config
    if mc is None:
        return None, "the dump's server_args did not pickle (no ModelConfig)"
    layers = _n(mc, "num_attention_layers") or _n(mc, "num_hidden_layers")
    q = _n(mc, "num_attention_heads")
    hd = _n(mc, "head_dim")
    if not (layers and q and hd):
        return None, "the dump's ModelConfig lacks layers / heads / head_dim"
    arch = mc.get("attention_arch")
    arch_v = arch.get("_args", (None,))[0] if hasattr(arch, "get") else None
    dtype = str(dump.server_args.get("kv_cache_dtype") or "auto")
    if dtype == "auto":
        dtype = str(mc.get("dtype") or "torch.bfloat16")
    dtype_bytes = _DTYPE_BYTES.get(dtype.replace("torch.", ""), 2)
    out = {"layers": layers, "q_heads": q, "head_dim": hd, "dtype_bytes": dtype_bytes}
    if _n(mc, "v_head_dim") and mc.get("v_head_dim") != hd:
        out["v_head_dim"] = mc.get("v_head_dim")
    if arch_v == ATTENTION_ARCH_MLA and _n(mc, "kv_lora_rank"):
        rope = int(mc.get("qk_rope_head_dim") or 0)
        out["mla"] = {"kv_lora_rank": mc.get("kv_lora_rank"), "qk_rope_head_dim": rope}
        if _n(mc, "qk_nope_head_dim"):
            # prefill attends as MHA over nope + rope dims (the deepseek-v3 preset's 192)
            out["head_dim"] = mc.get("qk_nope_head_dim") + rope
    else:
        out["kv_heads"] = _n(mc, "num_key_value_heads") or q
    out["params_b"] = _params_b(mc, layers, q, hd, out.get("kv_heads") or 1)
    return out, "from the dump's ModelConfig (configs/model_config.py)"


def _params_b(mc, layers, q, hd, kv) -> float:
    hf = mc.get("hf_text_config") or mc.get("hf_config")
    get = hf.get if hasattr(hf, "get") else (lambda k, d=None: d)
    hidden = int(get("hidden_size", 0) or mc.get("hidden_size") or q * hd)
    inter = int(get("intermediate_size", 0) or 4 * hidden)
    vocab = int(get("vocab_size", 0) or mc.get("vocab_size") or 32000)
    attn = hidden * (q * hd + 2 * kv * hd) + q * hd * hidden
    mlp = 3 * hidden * inter
    total = layers * (attn + mlp) + 2 * vocab * hidden
    return max(round(total / 1e9, 6), 1e-6)


def page_ids(tokens: tuple, page: int) -> list[int]:
    """One prefix id per full page: blake2b over the previous id and the page's tokens."""
    n_full = len(tokens) // page
    if n_full == 0:
        return []
    arr = np.asarray(tokens[: n_full * page], dtype=np.int64).reshape(n_full, page)
    out = []
    prev = b""
    for row in arr:
        h = hashlib.blake2b(prev + row.tobytes(), digest_size=8).digest()
        out.append(int.from_bytes(h, "little") >> 1)  # 63 bits: a plain JSON int
        prev = h
    return out


def _comment(dump: Dump, mapped, unmapped, model_note, n_req, skipped) -> str:
    lines = [f"# Imported by `hicache-sim import` from {Path(dump.path).name} "
             f"(SGLang 0.5.23 {'crash dump' if dump.kind == 'crash' else 'request dump'}):",
             f"# {n_req} requests into trace.jsonl ({skipped} skipped, see import.json).",
             f"# model: {model_note}.",
             "# Server args mapped (SGLang field = value -> scenario key):"]
    for m in mapped:
        lines.append(f"#   {m['field']} = {m['value']!r} -> {m['key']}: {m['set']!r} ({m['why']})")
    why = [u for u in unmapped if "why" in u]
    lines.append(f"# Not mapped: {len(unmapped)} fields (all in unmapped.json); of note:")
    for u in why:
        lines.append(f"#   {u['field']} = {u['value']!r}: {u['why']}")
    if dump.launch_command:
        cmd = dump.launch_command
        lines.append("# launch command: " + (cmd if len(cmd) <= 300 else cmd[:297] + "..."))
    # Every value comes from the file: one printable line each, so none can end the
    # comment and become YAML.
    return "".join(one_line(x) + "\n" for x in lines)


def write(dump: Dump, out_dir, *, name: str | None = None, model: str | None = None,
          profile: str | None = None) -> dict:
    """Write scenario.yaml, trace.jsonl, unmapped.json and import.json into ``out_dir``."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder; expected an output folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "import.json").is_file():
        raise UserError(f"{out}: a folder with other files; expected an empty folder or an "
                        "earlier `import` output (one with import.json)")
    keys, mapped, unmapped = map_server_args(dump.server_args)
    if model is not None:
        model_sec, model_note = {"preset": model}, f"preset {model!r} (--model)"
    else:
        model_sec, model_note = model_from_dump(dump)
        if model_sec is None:
            raise UserError(f"{dump.path}: {model_note}; expected the model: pass --model PRESET")
    page = keys.get("page_size", 1)
    t0 = dump.requests[0].created
    lines = []
    for r in dump.requests:
        rec = {"arrival_s": round(r.created - t0, 6), "input_len": len(r.input_ids),
               "output_len": r.output_len, "block_size": page,
               "blocks": page_ids(r.input_ids, page), "session": -1, "rid": r.rid,
               "finished": r.done, "cached_tokens": r.cached_tokens,
               "input_ids": list(r.input_ids)}
        lines.append(json.dumps(rec, separators=(",", ":")))

    if name is not None and not is_slug(name):
        raise UserError(f"--name {name!r}; expected {SLUG_RULE}")
    # the scenario name names a results folder: the file's stem, as a slug
    base = name or re.sub(r"[^A-Za-z0-9_.-]", "_", "dump_" + Path(dump.path).stem)[:200]
    scen = {"name": base,
            "description": f"Traffic and server args of SGLang dump {Path(dump.path).name}",
            "seed": 1, "model": model_sec}
    scen.update({k: keys[k] for k in ("tp", "dp", "page_size") if k in keys})
    if "device" not in keys:
        raise UserError(f"{dump.path}: neither max_total_tokens nor mem_fraction_static in the "
                        "server args; expected one to size the device pool")
    scen["device"] = keys["device"]
    if "host" in keys:
        scen["host"] = keys["host"]
    scen["cache"] = keys.get("cache", {})
    scen["cost"] = dict(keys.get("cost", {}))
    if profile:
        scen["cost"]["profile"] = profile
    if "storage" in keys:
        scen["storage"] = keys["storage"]
    scen["workload"] = {"kind": "trace", "format": "generic", "path": "trace.jsonl",
                        "block_size": page}
    scen["scheduler"] = dict(keys.get("scheduler", {}), decode=True)
    scen["on_divergence"] = "record"
    header = _comment(dump, mapped, unmapped, model_note, len(lines), len(dump.skipped))
    body = yaml.safe_dump(scen, sort_keys=False, default_flow_style=None, width=100)
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out / "trace.jsonl", "\n".join(lines) + "\n")
    atomic.write_json(out / "unmapped.json", unmapped)
    summary = {"source": str(dump.path), "kind": dump.kind, "requests": len(lines),
               "finished": sum(r.done for r in dump.requests),
               "skipped": [{"rid": a, "why": b} for a, b in dump.skipped],
               "mapped": [{k: v for k, v in m.items()} for m in mapped],
               "model": model_note, "launch_command": dump.launch_command,
               "server_cached_tokens": sum(r.cached_tokens or 0 for r in dump.requests),
               "tp_size": scen.get("tp", 1)}
    atomic.write_json(out / "import.json", _json_safe(summary))
    atomic.write_text(out / "scenario.yaml", header + body)
    return summary


def _json_safe(v):
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else repr(v)
    return repr(v)

