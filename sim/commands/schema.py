"""`hicache-sim schema [--markdown]`: the scenario schema, from ``sim.scenario``.

Without flags: the JSON Schema (``sim.schema_doc.json_schema``), for editors and YAML
language servers. ``--markdown``: the reference committed as docs/SCENARIO.md.
"""

from __future__ import annotations

NAME = "schema"
HELP = "Print the scenario file's JSON Schema (for editors), or with --markdown its reference."


def add_arguments(p) -> None:
    p.add_argument("--markdown", action="store_true",
                   help="print the Markdown reference (docs/SCENARIO.md) instead")


def run(args) -> int:
    import json

    from sim.schema_doc import json_schema, markdown

    if args.markdown:
        print(markdown(), end="")
    else:
        print(json.dumps(json_schema(), indent=2, ensure_ascii=False))
    return 0
