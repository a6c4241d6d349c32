"""The scenario reference, generated from the schema itself (``sim.scenario.Scenario``).

``docs/SCENARIO.md`` is this module's :func:`markdown` output, committed;
``tests/test_schema_doc.py`` regenerates it and fails when the committed file differs,
so the reference cannot go stale. Regenerate with

    hicache-sim schema --markdown > docs/SCENARIO.md

:func:`json_schema` is pydantic's ``model_json_schema()`` in standard JSON Schema
terms (pydantic leaves ``ge``/``le`` of annotated numbers as they are; editors read
``minimum``/``maximum``), for editors and YAML language servers.

Everything comes from the schema: types, defaults, ranges and allowed values from the
JSON Schema, descriptions from each section's docstring and each field's
``description`` or, where it has none, the comments written next to it in
``sim/scenario.py`` (read with ``tokenize``; nothing is imported or run from them).
"""

from __future__ import annotations

import copy
import inspect
import io
import json
import re
import tokenize

from pydantic import BaseModel

import sim.scenario as scenario
from sim.costs import MODEL_PRESETS, PROFILES, load_profile
from sim.costs.hybrid_models import HYBRID_MODEL_PRESETS
from sim.scenario import Scenario, _DistFields

scenario.describe_fields()  # the fields' docstrings, read on demand

DOC_PATH = "docs/SCENARIO.md"
REGENERATE = "hicache-sim schema --markdown > docs/SCENARIO.md"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}
_TYPE_IGNORE = re.compile(r"type:\s*ignore(\[[^\]]*\])?\s*")


# ----------------------------------------------------------------------------------
# The JSON Schema
# ----------------------------------------------------------------------------------


def _models() -> dict[str, type[BaseModel]]:
    """Every schema class of sim.scenario by name (the JSON Schema's ``$defs`` keys)."""
    out = {}
    for name, obj in vars(scenario).items():
        if inspect.isclass(obj) and issubclass(obj, BaseModel) and obj.__module__ == scenario.__name__:
            out[name] = obj
    return out


def raw_schema() -> dict:
    return Scenario.model_json_schema()


def _standard(node):
    """``node`` with pydantic's ``ge``/``le``/``gt``/``lt`` as JSON Schema bounds."""
    if isinstance(node, dict):
        return {_BOUNDS.get(k, k) if not isinstance(v, (dict, list)) else k: _standard(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_standard(v) for v in node]
    return node


def json_schema() -> dict:
    """The scenario's JSON Schema for editors: standard bounds, and the distributions'
    bare-number form (``turns: 5`` means ``{dist: constant, value: 5}``) allowed."""
    schema = _standard(copy.deepcopy(raw_schema()))
    models = _models()
    for name, node in schema.get("$defs", {}).items():
        cls = models.get(name)
        if cls is not None and issubclass(cls, _DistFields):
            obj = {k: v for k, v in node.items() if k not in ("title", "description")}
            schema["$defs"][name] = {
                "title": node.get("title", name), "description": node.get("description", ""),
                "anyOf": [{"type": "number", "minimum": 0,
                           "description": "a constant: {dist: constant, value: N}"}, obj]}
    # ``host: off`` (which YAML reads as false) means no host tier (sim.scenario._host_off).
    host = schema.get("properties", {}).get("host")
    if host is not None:
        schema["properties"]["host"] = {
            "anyOf": [host, {"const": False, "description": "host: off, no host tier"},
                      {"const": "off", "description": "no host tier"}]}
    return {"$schema": JSON_SCHEMA_DIALECT, **schema}


# ----------------------------------------------------------------------------------
# Descriptions written as comments next to the fields
# ----------------------------------------------------------------------------------


def _field_comments(cls: type[BaseModel]) -> dict[str, str]:
    """{field: the comments on the lines just above it and at the end of its line}."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENDMARKER):
            code_lines.add(tok.start[0])
    out: dict[str, str] = {}
    field_re = re.compile(r"^\s{4}([a-z_][a-z0-9_]*)\s*:")
    for no, text in enumerate(lines, start=1):
        m = field_re.match(text)
        if not m or m.group(1) not in cls.model_fields:
            continue
        above = []
        k = no - 1
        while k in comments and k not in code_lines:  # comment-only lines right above
            above.insert(0, comments[k])
            k -= 1
        parts = above + ([comments[no]] if no in comments and no in code_lines else [])
        # A trailing "type: ignore[...]" is for the type checker, not the reader.
        parts = [_TYPE_IGNORE.sub("", p).strip(" #") for p in parts]
        text = " ".join(p for p in parts if p)
        if text:
            out[m.group(1)] = text
    return out


# ----------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------


def _number(v) -> str:
    """A bound as a reader would write it: 2^63 - 1, 10^12, 65,536."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and v.is_integer() and abs(v) >= 1e6:
        v = int(v)
    if isinstance(v, int):
        a = abs(v)
        sign = "-" if v < 0 else ""
        for k in range(20, 64):
            if a == 2**k - 1:
                return f"{sign}2^{k} - 1"
            if a == 2**k:
                return f"{sign}2^{k}"
        if a >= 10**6 and str(a).rstrip("0") == "1":
            return f"{sign}10^{len(str(a)) - 1}"
        return f"{v:,}"
    return f"{v:g}"


def _code(v) -> str:
    return f"`{v}`"


def _yaml_value(v) -> str:
    """A default as compact YAML-ish text (JSON flow style reads as YAML)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v) if v == "" else v
    if isinstance(v, (int, float)):
        return _number(v) if isinstance(v, int) and abs(v) >= 10**6 else f"{v:g}" \
            if isinstance(v, float) else str(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_yaml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_yaml_value(x) for x in v) + "]"
    return str(v)


def _ref_name(node: dict) -> str | None:
    ref = node.get("$ref")
    return ref.rsplit("/", 1)[-1] if isinstance(ref, str) else None


def _anchor(name: str) -> str:
    return name.lower()


def _variants(node: dict) -> list[tuple[str, str]] | None:
    """[(discriminator value, def name)] of a discriminated union."""
    disc = node.get("discriminator")
    if not isinstance(disc, dict):
        return None
    return [(k, v.rsplit("/", 1)[-1]) for k, v in disc["mapping"].items()]


def _without_null(node: dict) -> tuple[dict, bool]:
    """(the schema without its ``null`` alternative, whether null is allowed)."""
    alts = node.get("anyOf")
    if isinstance(alts, list) and any(a.get("type") == "null" for a in alts):
        rest = [a for a in alts if a.get("type") != "null"]
        if len(rest) == 1:
            merged = {k: v for k, v in node.items() if k != "anyOf"}
            merged.update(rest[0])
            return merged, True
        return {**{k: v for k, v in node.items() if k != "anyOf"}, "anyOf": rest}, True
    return node, False


def _type(node: dict) -> str:
    node, nullable = _without_null(node)
    name = _ref_name(node)
    variants = _variants(node)
    if variants:
        disc = node["discriminator"]["propertyName"]
        text = f"one of, by `{disc}`: " + ", ".join(
            f"[`{k}`](#{_anchor(d)})" for k, d in variants)
    elif name:
        text = f"section [{name}](#{_anchor(name)})"
    elif node.get("type") == "array":
        text = f"list of {_type(node.get('items', {}))}"
    elif node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
        text = f"mapping of rank to {_type(node['additionalProperties'])}" \
            if "skew" in str(node.get("title", "")).lower() else \
            f"mapping to {_type(node['additionalProperties'])}"
    elif "const" in node or "enum" in node:
        text = node.get("type", "string")
    elif "anyOf" in node:
        text = " or ".join(_type(a) for a in node["anyOf"])
    else:
        text = node.get("type", "any")
    return f"{text} or null" if nullable else text


def _allowed(node: dict) -> str:
    node, _ = _without_null(node)
    if "const" in node:
        return _code(node["const"])
    if "enum" in node:
        return ", ".join(_code(v) for v in node["enum"])
    parts = []
    lo = [(k, node[k]) for k in ("ge", "gt", "minimum", "exclusiveMinimum") if k in node]
    hi = [(k, node[k]) for k in ("le", "lt", "maximum", "exclusiveMaximum") if k in node]
    if lo or hi:
        left = (f"{_number(lo[0][1])} {'<' if lo[0][0] in ('gt', 'exclusiveMinimum') else '<='} "
                if lo else "")
        right = (f" {'<' if hi[0][0] in ('lt', 'exclusiveMaximum') else '<='} {_number(hi[0][1])}"
                 if hi else "")
        parts.append(f"{left}x{right}")
    for key, what in (("minLength", "at least {} character"), ("maxLength", "at most {} character"),
                      ("minItems", "at least {} item"), ("maxItems", "at most {} item")):
        if key in node:
            n = node[key]
            parts.append(what.format(_number(n)) + ("s" if n != 1 else ""))
    if node.get("type") == "array":
        inner = _allowed(node.get("items", {}))
        if inner:
            parts.append(f"each: {inner}")
    if node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
        inner = _allowed(node["additionalProperties"])
        if inner:
            parts.append(f"each value: {inner}")
    return "; ".join(parts)


def _default(cls: type[BaseModel] | None, field: str, node: dict, required: bool) -> str:
    if required:
        return "**required**"
    if "default" in node:
        return _code(_yaml_value(node["default"]))
    info = cls.model_fields.get(field) if cls is not None else None
    if info is not None and info.default_factory is not None:
        value = info.default_factory()
        if isinstance(value, _DistFields):  # a distribution's default is one value
            return _code(_yaml_value(value.model_dump(mode="json", exclude_none=True)))
        if isinstance(value, BaseModel):  # a section: its own table lists each default
            return "(the section's defaults)"
        return _code(_yaml_value(value))
    return ""


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _doc(text: str | None) -> str:
    """A docstring as one Markdown paragraph (``double backticks`` become single)."""
    return " ".join((text or "").split()).replace("``", "`")


def _sections(schema: dict) -> list[tuple[str, list[str], str | None]]:
    """[(def name, [key paths where it appears], the variant it is, e.g. ``kind: trace``)]
    in the order a reader meets them. A mix's ``workload.parts[]`` items repeat the
    workload kinds' keys, so those paths are listed only where no ``workload.`` path
    has the same tail (the intro says so)."""
    defs = schema.get("$defs", {})
    order: list[str] = []
    paths: dict[str, list[str]] = {}
    variant: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()

    def visit(name: str, path: str) -> None:
        if name not in paths:
            order.append(name)
            paths[name] = []
        if (name, path) in seen:
            return
        seen.add((name, path))
        if path not in paths[name]:
            paths[name].append(path)
        node = defs.get(name) if name != "Scenario" else schema
        for key, prop in (node or {}).get("properties", {}).items():
            walk(prop, f"{path}.{key}" if path else key)

    def walk(prop: dict, path: str) -> None:
        prop, _ = _without_null(prop)
        if prop.get("type") == "array":
            walk(prop.get("items", {}), f"{path}[]")
            return
        variants = _variants(prop)
        if variants:
            disc = prop["discriminator"]["propertyName"]
            for value, name in variants:
                variant.setdefault(name, f"{disc}: {value}")
                visit(name, path)
            return
        name = _ref_name(prop)
        if name:
            visit(name, path)

    visit("Scenario", "")
    mix = "workload.parts[]"
    out = []
    for n in order:
        ps = paths[n]
        plain = {p for p in ps if not p.startswith(mix)}
        ps = [p for p in ps if not p.startswith(mix) or "workload" + p[len(mix):] not in plain]
        out.append((n, ps, variant.get(n)))
    return out


INTRO = """\
# Scenario file reference

<!-- Generated from sim/scenario.py by sim/schema_doc.py; do not edit by hand.
     Regenerate with: {regen}
     tests/test_schema_doc.py fails when this file is not current. -->

Every key a scenario YAML file may hold, generated from the schema the simulator
validates against (`sim/scenario.py`, pydantic). Unknown keys are errors; `inf` and
`nan` are rejected. `hicache-sim schema` prints the same schema as JSON Schema, for
editors (e.g. a YAML language server's `# yaml-language-server: $schema=...` line), and
`hicache-sim validate SCENARIO` checks a file against it. `scenarios/README.md`
explains the workload kinds and the trace formats; `--set KEY.PATH=VALUE` overrides any
key below on the command line.

Each section is one mapping in the file; "appears at" gives its key paths (`a.b[]` is
a list item). A section titled `(kind: x)` is the variant chosen by that key's value. A
`mix` workload's `workload.parts[]` items are workloads of any other kind, with the
same keys as at `workload`. Ranges: `x` is the value.
"""


def markdown() -> str:
    """docs/SCENARIO.md's text: deterministic (schema order, no dates)."""
    schema = raw_schema()
    defs = schema.get("$defs", {})
    models = _models()
    out = [INTRO.format(regen=REGENERATE)]
    for name, paths, variant in _sections(schema):
        node = schema if name == "Scenario" else defs[name]
        cls = models.get(name)
        shown = ", ".join(_code(p) for p in paths if p) or "the top level of the file"
        title = f"{name} (`{variant}`)" if variant else name
        out.append(f'<a id="{_anchor(name)}"></a>\n\n## {title}\n')
        out.append(f"Appears at: {shown}.\n")
        if node.get("description"):
            out.append(_doc(node["description"]) + "\n")
        required = set(node.get("required", []))
        comments = _field_comments(cls) if cls is not None else {}
        rows = ["| key | type | default | allowed values | description |",
                "|---|---|---|---|---|"]
        for key, prop in node.get("properties", {}).items():
            info = cls.model_fields.get(key) if cls is not None else None
            # The field's own description, else the comments written next to it.
            desc = (info.description if info is not None else None) or comments.get(key, "")
            rows.append("| " + " | ".join([
                _code(key), _cell(_type(prop)), _cell(_default(cls, key, prop, key in required)),
                _cell(_allowed(prop)), _cell(_doc(desc))]) + " |")
        out.append("\n".join(rows) + "\n")
    out.append(presets_markdown())
    out.append(profiles_markdown())
    return "\n".join(out)


def _table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]) + "\n"


def _params(n: float | None) -> str:
    return "-" if not n else f"{n / 1e9:,.1f}B"


def presets_markdown() -> str:
    """The names ``model.preset`` and ``model.hybrid_preset`` accept, from their
    registries (``sim.costs.MODEL_PRESETS``, ``sim.costs.hybrid_models``)."""
    rows = []
    for name, m in MODEL_PRESETS.items():
        kv = (f"MLA latent {m.kv_lora_rank} + rope {m.qk_rope_head_dim}" if m.is_mla
              else f"{m.kv_heads} KV heads x {m.head_dim}")
        rows.append([_code(name), str(m.layers), kv, str(m.dtype_bytes),
                     f"{m.bytes_per_token(1):,}", _params(m.active_params),
                     _params(m.total_params or m.active_params)])
    out = ['<a id="model-presets"></a>\n\n## Model presets\n',
           "`model.preset` names one of these (`sim/costs/models.py`, `MODEL_PRESETS`); keys "
           "beside it override its geometry. KV bytes per token are at `tp: 1` (a rank holds "
           "its share of the KV heads; MLA's latent is whole on every rank).\n",
           _table(["preset", "layers", "KV geometry", "KV bytes per element",
                   "KV bytes per token (tp 1)", "active params", "total params"], rows)]
    rows = []
    for name, h in HYBRID_MODEL_PRESETS.items():
        other = (f"{h.swa_layers} SWA layers, window {h.sliding_window:,} tokens"
                 if h.kind == "swa" else f"{h.mamba_layers} Mamba layers")
        rows.append([_code(name), "(FULL, SWA)" if h.kind == "swa" else "(FULL, MAMBA)",
                     str(h.full.layers), other, f"{h.full.bytes_per_token(1):,}"])
    out += ["`model.hybrid_preset` names one of these (`sim/costs/hybrid_models.py`, "
            "`HYBRID_MODEL_PRESETS`; docs/HYBRID.md), alone: a hybrid's geometry is fixed.\n",
            _table(["hybrid preset", "components", "full-attention layers", "other layers",
                    "FULL KV bytes per token (tp 1)"], rows)]
    return "\n".join(out)


def profiles_markdown() -> str:
    """The names ``cost.profile`` accepts, from the registry (``sim.costs.PROFILES``:
    the YAML files under profiles/, read as data)."""
    rows = []
    for name in PROFILES:
        p = load_profile(name)
        rows.append([_code(name), p.gpu, f"{p.hbm_gib:g}", p.host_link or "-",
                     f"{p.bw_h2d_gbps:g} / {p.bw_d2h_gbps:g}", f"{p.peak_tflops:g}"])
    return "\n".join([
        '<a id="gpu-profiles"></a>\n\n## GPU profiles\n',
        "`cost.profile` names one of these (`profiles/*.yaml`, `sim.costs.PROFILES`) or gives "
        "a path to a profile YAML of the same keys (`hicache-sim calibrate` writes one). "
        "The GPU memory sizes `device.mem_fraction_static` pools.\n",
        _table(["profile", "GPU", "memory (GiB)", "host link", "H2D / D2H copy (GB/s)",
                "dense BF16 peak (TFLOP/s)"], rows)])


__all__ = ["markdown", "json_schema", "raw_schema", "DOC_PATH", "REGENERATE"]
