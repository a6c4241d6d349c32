"""docs/ARCHITECTURE.md stays true to the code it maps.

The document is a newcomer's map: a folder table in import order and one request's
path through the files. A map that names a moved file, a renamed function or a
module it forgot is worse than none, so these checks read the document and the
source and fail on what the document gets wrong:

* every repository path it names exists;
* every module under ``sim/`` has a row of the folder table;
* imports go down the table, except the back-edges its first paragraph names (and
  each of those still exists, so the paragraph cannot go stale either);
* where it names a file and then a name (`` `sim/x.py` `Name.attr` ``), the file
  defines each part of that name;
* every name the walk-through section quotes occurs in the source (functions,
  classes, attributes, and the SGLang names the source cites in its comments).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
WALK_TITLE = "## One request's path, file by file"

# The imports that go up the folder table, as the document's first paragraph names
# them: (importing file, imported file).
UP_IMPORTS = {
    ("sim/policies/sync.py", "sim/collectives.py"),
    ("sim/events.py", "sim/lanes.py"),
    ("sim/prefill.py", "sim/lanes.py"),
    ("sim/decode.py", "sim/lanes.py"),
    ("sim/events.py", "sim/storage/engine.py"),
    ("sim/hybrid/replay.py", "sim/optrace_check.py"),
    ("sim/census.py", "reports/census.py"),
    ("sim/repro/case.py", "sim/commands/run.py"),
}

# One backticked span per match, never across lines (the document's code blocks
# hold no paths this file checks).
SPAN = re.compile(r"`([^`\n]+)`")
PATH_ROOTS = ("sim/", "reports/", "tests/", "scenarios/", "docs/", "tools/", "benchmarks/")


def _sources() -> list[Path]:
    return sorted(ROOT.glob("sim/**/*.py")) + [ROOT / "cli.py"] + sorted(ROOT.glob("reports/*.py"))


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def _table_rows() -> list[tuple[str, list[str]]]:
    table = DOC.split("| layer | where |", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append((cells[0], re.findall(r"`((?:sim/|cli\.py|reports/)[^`]*)`", cells[1])))
    return rows


def _row_of(rows, path: str) -> int | None:
    """The row whose ``where`` names ``path``: the file itself or, else, the deepest
    folder holding it (``sim/storage/engine.py`` has a row of its own)."""
    best = None
    for i, (_name, paths) in enumerate(rows):
        for p in paths:
            if path == p or (p.endswith("/") and path.startswith(p)):
                if best is None or len(p) > best[1]:
                    best = (i, len(p))
    return None if best is None else best[0]


def _module_files() -> dict[str, str]:
    out = {}
    for p in _sources():
        parts = p.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = _rel(p)
    return out


def _imports(path: str, modules: dict[str, str]):
    """The repository files ``path`` imports (at any depth: lazy imports count)."""
    tree = ast.parse((ROOT / path).read_text())
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            names = [f"{n.module}.{a.name}" if f"{n.module}.{a.name}" in modules else n.module
                     for a in n.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                yield modules[name]


def _defined(path: str) -> set[str]:
    """Every name ``path`` defines anywhere: functions, classes, assigned names and
    attributes, parameters, ``__slots__`` entries."""
    tree = ast.parse((ROOT / path).read_text())
    names: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            names.add(n.attr)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            names.add(n.target.id)
        elif isinstance(n, (ast.ImportFrom, ast.Import)):
            names.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier():
            names.add(n.value)  # __slots__ entries, registry keys
    return names


def test_named_paths_exist():
    missing = []
    for span in set(SPAN.findall(DOC)):
        if " " in span or not (span.startswith(PATH_ROOTS) or span == "cli.py"):
            continue
        if not (ROOT / span.rstrip("/")).exists():
            missing.append(span)
    assert not missing, f"docs/ARCHITECTURE.md names paths that do not exist: {sorted(missing)}"


def test_every_module_has_a_row():
    rows = _table_rows()
    lost = [f for f in _module_files().values()
            if f.startswith("sim/") and f != "sim/__init__.py" and _row_of(rows, f) is None]
    assert not lost, f"modules with no row in docs/ARCHITECTURE.md's folder table: {lost}"


def test_imports_go_down_the_table():
    rows, modules = _table_rows(), _module_files()
    up = set()
    for path in modules.values():
        r = _row_of(rows, path)
        if r is None:
            continue  # sim/__init__.py (the version): every row may use it
        for target in _imports(path, modules):
            rt = _row_of(rows, target)
            if rt is not None and rt > r:
                up.add((path, target))
    assert up - UP_IMPORTS == set(), (
        f"imports up docs/ARCHITECTURE.md's folder table it does not name: {sorted(up - UP_IMPORTS)}")
    assert UP_IMPORTS - up == set(), (
        f"back-edges the document names that no longer exist: {sorted(UP_IMPORTS - up)}")
    intro = DOC.split("| layer | where |", 1)[0]
    for a, b in UP_IMPORTS:
        assert f"`{a}`" in intro and f"`{b}`" in intro, f"{a} -> {b} is not named in the intro"


def test_file_then_name_is_defined_there():
    pairs = re.findall(r"`((?:sim/[^`\s]*|cli)\.py)`\s+`([A-Za-z_][A-Za-z0-9_.]*)", DOC)
    assert len(pairs) > 40  # the walk-through alone names that many
    wrong = []
    for path, name in set(pairs):
        defined = _defined(path)
        for part in name.split("."):
            if part not in defined:
                wrong.append(f"{path} {name}")
                break
    assert not wrong, f"names docs/ARCHITECTURE.md puts in files that do not define them: {wrong}"


def test_walkthrough_names_occur_in_the_source():
    walk = DOC.split(WALK_TITLE, 1)[1].split("\n## ", 1)[0]
    text = "\n".join(p.read_text() for p in _sources())
    words = set(re.findall(r"\b\w+\b", text))
    unknown = set()
    for span in SPAN.findall(walk):
        if span.startswith(PATH_ROOTS) or span.endswith((".py", ".yaml")) or "/" in span:
            continue
        for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span):
            if name not in words:
                unknown.add(name)
    assert not unknown, f"the walk-through names what the source never mentions: {sorted(unknown)}"
