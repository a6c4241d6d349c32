"""docs/SCENARIO.md is generated from the schema and must be current; `schema` prints
the JSON Schema, which accepts every shipped scenario and rejects what the loader does."""

import json

import jsonschema
import pytest
import yaml

import cli
from conftest import ROOT
from sim.schema_doc import DOC_PATH, REGENERATE, json_schema, markdown
from sim.scenario import Scenario

SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


def test_the_committed_reference_is_current():
    committed = (ROOT / DOC_PATH).read_text(encoding="utf-8")
    assert committed == markdown(), f"{DOC_PATH} is stale: regenerate it with `{REGENERATE}`"


def _sections(md: str) -> dict[str, str]:
    parts = md.split("\n## ")[1:]
    return {p.split("\n", 1)[0]: p for p in parts}


def test_the_reference_lists_every_key_with_type_default_range_and_description():
    md = markdown()
    sections = _sections(md)
    # every field of every section, as a table row
    for title, body in sections.items():
        if title in ("Model presets", "GPU profiles"):  # the registries, not sections
            continue
        name = title.split(" ")[0]
        model = Scenario if name == "Scenario" else None
        if model is None:
            import sim.scenario as s
            model = getattr(s, name)
        for field in model.model_fields:
            assert f"| `{field}` |" in body, (title, field)
    cache = sections["Cache"]
    row = next(ln for ln in cache.splitlines() if ln.startswith("| `host_policy`"))
    assert "`duplicate_first`" in row and "`duplicate_first_single_pass`" in row and "PR #33777" in row
    seed = next(ln for ln in sections["Scenario"].splitlines() if ln.startswith("| `seed`"))
    assert "| integer | `0` | 0 <= x <= 2^63 - 1 |" in seed
    trace = sections["Trace (`kind: trace`)"]
    assert "Appears at: `workload`." in trace and "| `path` | string | **required** |" in trace
    # a comment written next to the field is its description
    assert "conversations per second (poisson)" in sections["ConversationStart"]
    assert "Appears at: `workload.output_tokens`" in sections["Dist"]


def test_schema_prints_the_json_schema_and_markdown(capsys):
    assert cli.main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json_schema() and printed["title"] == "Scenario"
    assert cli.main(["schema", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown()


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_shipped_scenario_is_valid_for_editors(path):
    doc = yaml.safe_load(path.read_text())
    # YAML reads rank keys (``{1: -640}``) as ints; JSON object keys are strings.
    doc = json.loads(json.dumps(doc))
    jsonschema.validate(doc, json_schema())


def test_the_json_schema_rejects_what_the_loader_rejects():
    doc = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    schema = json_schema()
    for bad in ({**doc, "tp": 0}, {**doc, "no_such_key": 1},
                {**doc, "cache": {"host_policy": "nope"}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    jsonschema.validate({**doc, "workload": {**doc["workload"], "turns": 5}}, schema)  # bare number


_DESCRIPTIONS = """
import json, sys
import pydantic
if sys.argv[1] == "eager":  # pydantic's own reading of the docstrings, while building each class
    plain = pydantic.ConfigDict
    pydantic.ConfigDict = lambda **kw: plain(**kw, use_attribute_docstrings=True)
import sim.scenario as s
if sys.argv[1] == "lazy":
    s.describe_fields()
models = {n: c for n, c in vars(s).items()
          if isinstance(c, type) and issubclass(c, s._Model) and c.__module__ == s.__name__}
print(json.dumps({n: [{k: f.description for k, f in c.model_fields.items()},
                      c.model_json_schema()] for n, c in models.items()}, sort_keys=True))
"""


def test_descriptions_read_on_demand_are_the_ones_pydantic_reads_at_import():
    """sim.scenario does not read its fields' docstrings while building the classes
    (describe_fields does, for the schema's readers): every field's description and
    every section's JSON Schema are what pydantic's use_attribute_docstrings gives."""
    import os
    import subprocess
    import sys

    def dump(mode):
        r = subprocess.run([sys.executable, "-c", _DESCRIPTIONS, mode], cwd=ROOT, check=True,
                           capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
        return json.loads(r.stdout)

    eager, lazy, bare = dump("eager"), dump("lazy"), dump("bare")
    assert lazy == eager
    described = sum(d is not None for fields, _ in eager.values() for d in fields.values())
    assert described > 100  # the docstrings are there to read
    assert sum(d is not None for fields, _ in bare.values() for d in fields.values()) < described
