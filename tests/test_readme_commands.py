"""Every command the README shows, on a fresh clone: each one runs, cut to a small size,
and exits as the README says.

The commands are extracted from the README itself: the fenced ``sh`` blocks, plain
fenced blocks that start with ``hicache-sim``, the command table and the inline
``hicache-sim ...`` / ``make ...`` / ``python ...`` spans. Each must have a row in
``CUT`` saying how it runs here (the same command with a small request count, a dry
run or ``--help`` where a whole run takes minutes) and what it must exit with; a
README command without a row fails the suite, so a new command gets a check.

They run in a copy of the repository's files in a temporary folder with no
``../shared`` beside it and an empty trace cache: the layout of a fresh clone.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

README = (ROOT / "README.md").read_text()
SMALL = ["--set", "limits.max_requests=20"]


def _join_continuations(block: str) -> list[str]:
    out, cur = [], ""
    for line in block.splitlines():
        line = line.split("  #", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            cur += line[:-1].strip() + " "
            continue
        cur += line.strip()
        if cur:
            out.append(cur)
        cur = ""
    return out


def readme_commands(text: str = README) -> list[str]:
    """The README's commands, each once, in the order they first appear."""
    found: list[str] = []
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        lines = _join_continuations(body)
        if lang == "sh" or (lines and lines[0].startswith("hicache-sim ")):
            found += lines
    for row in re.findall(r"^\| `(hicache-sim [^|]*?)` \|", text, re.M):
        found += [c.strip(" `") for c in row.split("` / `")]
    found += [m.replace("\\|", "|") for m in
              re.findall(r"`((?:hicache-sim|make|python) [^`]+)`", text)]
    return list(dict.fromkeys(" ".join(c.split()) for c in found))


def _synopsis(cmd: str) -> bool:
    """A command-table synopsis (placeholders, optional flags), not a runnable line."""
    return bool(re.search(r"\[|\b[A-Z]{3,}\b|\.\.\.|\w\|\w", cmd))


HELP = "help"  # run `hicache-sim SUBCOMMAND --help`: exit 0
# README command -> (what runs instead, relative to the clone; expected exit code).
# "{tmp}" is a scratch folder outside the clone.
CUT: dict[str, tuple[list[str] | str, int]] = {
    "make run": ("make-run", 0),
    "make test": (["make", "-n", "test"], 0),
    "make test INSTALL_BROWSER=1": (["make", "-n", "test", "INSTALL_BROWSER=1"], 0),
    "make browser INSTALL_BROWSER=1": (["make", "-n", "browser", "INSTALL_BROWSER=1"], 0),
    "make bench": (["python", "benchmarks/bench_tree.py", "--ops", "2000", "--hybrid-ops", "400"], 0),
    "make figures": (["python", "tools/figures.py", "--check"], 0),
    "make figures ONLY=capacity_sweep": (["python", "tools/figures.py", "--list", "--only",
                                          "capacity_sweep"], 0),
    # no ../shared/oracle on a clone: each stops at once with one line, exit 2
    "make conformance-sglang": (["make", "conformance-sglang"], 2),
    "make conformance-hybrid-sglang": (["make", "conformance-hybrid-sglang"], 2),
    "make conformance-hybrid-engine-sglang": (["make", "conformance-hybrid-engine-sglang"], 2),
    "make conformance-server": (["make", "conformance-server"], 2),
    # no SGLang needed: the real side is vendored; one group stands for the 70
    "make conformance-tp2": (["python", "tools/conformance_tp2.py", "--only",
                              "t01_hostpress_ps1.reclaim_skip_at40"], 0),
    "make conformance-*": ("make-conformance-all", 2),
    ". .venv/bin/activate": ("venv-path", 0),
    "hicache-sim --help": (["hicache-sim", "--help"], 0),
    "hicache-sim COMMAND --help": (["hicache-sim", "run", "--help"], 0),
    "hicache-sim plan scenarios/mooncake_conversation.yaml --set cost.profile=h100-sxm --set "
    "device.mem_fraction_static=auto --set 'node={host_ram_gb: 2048}' --target-hit-rate 0.3 "
    "--jobs 2": ("plan-cut", 0),
    "hicache-sim plan scenarios/regressions/sglang_39436.yaml --jobs 2": (
        ["hicache-sim", "plan", "scenarios/regressions/sglang_39436.yaml", "--jobs", "1",
         "--kv-points", "1", "--slot-points", "2", "-o", "{tmp}/p39436", "--quiet", *SMALL], 0),
    "hicache-sim plan scenarios/mooncake_fig9.yaml": (
        ["hicache-sim", "plan", "scenarios/mooncake_fig9.yaml", "--check-points", "0",
         "--opt-points", "0", "--grid-points", "5", "-o", "{tmp}/pfig9", "--quiet",
         "--set", "limits.max_requests=300"], 0),
    "hicache-sim run scenarios/hybrid_mamba.yaml -o results/hybrid_mamba": (
        ["hicache-sim", "run", "scenarios/hybrid_mamba.yaml", "-o", "results/hybrid_mamba",
         "--quiet", *SMALL], 0),
    "hicache-sim run scenarios/storage_buffer_only.yaml": (
        ["hicache-sim", "run", "scenarios/storage_buffer_only.yaml", "-o", "{tmp}/buf",
         "--quiet", *SMALL], 0),
    "hicache-sim census scenarios/hybrid_mamba.yaml --seeds 20": (
        ["hicache-sim", "census", "scenarios/hybrid_mamba.yaml", "--seeds", "2", "--jobs", "1",
         "-o", "{tmp}/census", "--quiet", *SMALL], 0),
    "hicache-sim census SCENARIO --seeds 50": (HELP, 0),
    "hicache-sim sweep scenarios/sweeps/capacity.yaml": ("sweep-cut", 0),
    "hicache-sim plot results/sweeps/capacity": ("plot-cut", 0),
    "hicache-sim traces": (["hicache-sim", "traces"], 0),
    # no network in CI: an empty mirror, refused in one line (the fetch path, offline)
    "hicache-sim traces fetch mooncake-toolagent": (
        ["hicache-sim", "traces", "fetch", "mooncake-toolagent", "--mirror", "file://{tmp}"], 2),
    "hicache-sim plan SCENARIO": (HELP, 0),
    "python benchmarks/divergence_table.py --write": (
        ["python", "benchmarks/divergence_table.py", "--help"], 0),
    "python tools/result_hashes.py --write": (["python", "tools/result_hashes.py", "--help"], 0),
    "hicache-sim run scenarios/quickstart.yaml --set workload.num_requests=100000": (
        ["hicache-sim", "run", "scenarios/quickstart.yaml", "-o", "{tmp}/q1e5", "--quiet",
         "--set", "workload.num_requests=40"], 0),
    "python benchmarks/three_tier_capacity.py": (
        ["python", "benchmarks/three_tier_capacity.py", "--help"], 0),
}


def test_every_readme_command_has_a_check():
    missing = [c for c in readme_commands() if c not in CUT and not _synopsis(c)]
    assert not missing, f"README commands with no row in CUT: {missing}"
    stale = [c for c in CUT if c not in readme_commands()]
    assert not stale, f"rows in CUT for commands the README no longer shows: {stale}"


def test_every_subcommand_is_in_the_command_table():
    from cli import build_parser

    _, handlers = build_parser()
    table = {c.split()[1] for c in readme_commands() if c.startswith("hicache-sim ") and _synopsis(c)}
    hidden = {"verify-bundle"}  # the internal replay helper, documented in docs/REPRO.md
    assert set(handlers) - hidden <= table | {"replay-ops", "replay"}, set(handlers) - table


# ----------------------------------------------------------------------------------
# The clone
# ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The repository's files (tracked, and new ones git does not ignore) in a fresh
    folder with no ../shared beside it."""
    base = tmp_path_factory.mktemp("fresh")
    repo = base / "hicache-sim"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            dst = repo / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    assert not (base / "shared").exists()
    tmp = base / "scratch"
    tmp.mkdir()
    return repo, tmp


def _env(repo: Path, tmp: Path) -> dict:
    # a user's shell: none of the oracle's variables, no consent, and not inside the
    # `make test` that may be running this suite (its MAKEFLAGS / MAKELEVEL)
    drop = {"HICACHE_SGLANG_ORACLE", "SGLANG_ORACLE", "CI", "INSTALL_BROWSER", "MAKEFLAGS",
            "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PYTHONPATH=str(repo), HICACHE_TRACE_CACHE=str(tmp / "trace-cache"),
               SGLANG_ORACLE_VENV=str(tmp / "no-oracle-venv"))
    return env


def _argv(args: list[str], repo: Path, tmp: Path) -> list[str]:
    args = [a.replace("{tmp}", str(tmp)) for a in args]
    if args[0] == "hicache-sim":
        return [sys.executable, str(repo / "cli.py"), *args[1:]]
    if args[0] == "python":
        return [sys.executable, *args[1:]]
    return args


def _run(args, repo, tmp) -> subprocess.CompletedProcess:
    return subprocess.run(_argv(list(args), repo, tmp), cwd=repo, env=_env(repo, tmp),
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)


def _special(kind: str, cmd: str, repo: Path, tmp: Path) -> list[subprocess.CompletedProcess]:
    if kind == "make-run":
        # the command `make run` runs, as the Makefile spells it, cut to 20 requests
        dry = _run(["make", "-n", "run"], repo, tmp)
        assert dry.returncode == 0, dry.stderr
        line = dry.stdout.strip().splitlines()[-1]
        args = shlex.split(line)
        assert args[0] == ".venv/bin/hicache-sim", line
        return [dry, _run(["hicache-sim", *args[1:], "--quiet", *SMALL], repo, tmp)]
    if kind == "make-conformance-all":
        targets = re.search(r"^ORACLE_TARGETS := (.*?[^\\])$", (repo / "Makefile").read_text(),
                            re.S | re.M).group(1).replace("\\\n", " ").split()
        assert len(targets) >= 5
        return [_run(["make", t], repo, tmp) for t in targets]
    if kind == "venv-path":
        # the README's activate line names the folder the Makefile builds
        assert re.search(r"^VENV := \.venv$", (repo / "Makefile").read_text(), re.M)
        return []
    if kind == "plan-cut":
        args = shlex.split(cmd)[1:]
        args[args.index("--jobs") + 1] = "1"
        return [_run(["hicache-sim", *args, "--check-points", "1", "--opt-points", "0",
                      "--grid-points", "5", "-o", "{tmp}/pmooncake", "--quiet",
                      "--set", "limits.max_requests=300"], repo, tmp)]
    if kind == "sweep-cut":
        # the shipped sweep, cut to one point per workload: the file's own bases and keys
        import yaml

        path = repo / "scenarios" / "sweeps" / "capacity.yaml"
        spec = yaml.safe_load(path.read_text())
        spec["zip"] = {k: v[:1] for k, v in spec["zip"].items()}
        spec["grid"] = {k: v[:1] for k, v in spec["grid"].items()}
        spec["seeds"] = spec["seeds"][:1]
        spec.setdefault("set", {})["limits.max_requests"] = 20
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return [_run(["hicache-sim", *shlex.split(cmd)[1:], "--quiet", "--workers", "1"], repo, tmp)]
    if kind == "plot-cut":
        # its input is the sweep's folder (run here too: tests may be spread over workers)
        first = [] if (repo / "results" / "sweeps" / "capacity" / "sweep.parquet").is_file() else \
            _special("sweep-cut", "hicache-sim sweep scenarios/sweeps/capacity.yaml", repo, tmp)
        return first + [_run(shlex.split(cmd) + ["-o", "{tmp}/plots"], repo, tmp)]
    raise AssertionError(kind)


@pytest.mark.parametrize("cmd", list(CUT))
def test_a_readme_command_on_a_fresh_clone(clone, cmd):
    repo, tmp = clone
    how, rc = CUT[cmd]
    if how == HELP:
        runs = [_run(["hicache-sim", cmd.split()[1], "--help"], repo, tmp)]
    elif isinstance(how, str):
        runs = _special(how, cmd, repo, tmp)
    else:
        runs = [_run(how, repo, tmp)]
    for p in runs:
        assert "Traceback" not in p.stderr, p.stderr
        assert p.returncode == rc, (p.args, p.returncode, p.stderr[-2000:])
        if rc == 2:
            ours = [ln for ln in p.stderr.splitlines()
                    if not re.match(r"make(\[\d+\])?: \*\*\* ", ln)]  # make's own line
            assert len(ours) == 1, p.stderr
        if cmd.startswith("make conformance") and rc == 2:
            assert "../shared/oracle" in p.stderr and "SGLANG_ORACLE=DIR" in p.stderr, p.stderr
    if cmd == "make bench":
        assert "sglang column skipped: no SGLang oracle" in runs[0].stdout, runs[0].stdout


@pytest.mark.parametrize("cmd", [c for c in readme_commands() if _synopsis(c) and
                                 c.startswith("hicache-sim ") and c.split()[1].islower()])
def test_a_command_table_synopsis_has_its_help(cmd):
    import contextlib
    import io

    import cli

    def help_of(*args) -> tuple[int, str]:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()), \
                pytest.raises(SystemExit) as exit_:
            cli.main([*args, "--help"])
        return exit_.value.code, buf.getvalue()

    name = cmd.split()[1]
    code, text = help_of(name)
    assert code == 0
    # its sub-commands' help too (traces list / verify / fetch)
    for word in sorted(set(re.findall(r"[\[|]([a-z]+)\b", cmd))):
        sub_code, sub_text = help_of(name, word)
        if sub_code == 0:
            text += sub_text
    # every flag the synopsis shows is one the command takes
    for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", cmd):
        assert flag in text, (cmd, flag)


# ----------------------------------------------------------------------------------
# `make browser`: installs system-wide only with consent
# ----------------------------------------------------------------------------------


def _stub_path(tmp: Path) -> Path:
    """A PATH with no Chromium, and apt-get / sudo stubs that log their calls."""
    bin_ = tmp / "stubbin"
    bin_.mkdir(exist_ok=True)
    log = tmp / "apt.log"
    for name in ("apt-get", "sudo"):
        (bin_ / name).write_text(f"#!/bin/sh\necho {name} \"$@\" >> {log}\n"
                                 + ('[ "$1" = apt-get ] && shift && exec apt-get "$@"\n'
                                    if name == "sudo" else ""))
        (bin_ / name).chmod(0o755)
    for tool in ("id", "sh"):
        real = shutil.which(tool)
        if real and not (bin_ / tool).exists():
            (bin_ / tool).symlink_to(real)
    return bin_


@pytest.mark.parametrize("consent,installs", [
    ({}, False), ({"INSTALL_BROWSER": "1"}, True), ({"CI": "true"}, True), ({"CI": "false"}, False),
])
def test_make_browser_asks_before_installing(tmp_path, consent, installs):
    from test_report_browser import BROWSER_MISSING

    bin_ = _stub_path(tmp_path)
    env = {"PATH": str(bin_), "HOME": str(tmp_path), **consent}
    p = subprocess.run([shutil.which("make"), "-s", "-C", str(ROOT), "browser"], env=env,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    log = tmp_path / "apt.log"
    if installs:
        assert "install -y -q chromium" in log.read_text()
    else:
        assert not log.exists()  # nothing installed, nothing asked of apt
        assert p.stderr.strip() == f"make browser: {BROWSER_MISSING}"


# ----------------------------------------------------------------------------------
# Files the README and the --help texts name are in the repository
# ----------------------------------------------------------------------------------

_REPO_PATH = re.compile(r"(?<![\w./-])((?:docs|data|scenarios|benchmarks|tools|sim|reports|tests|"
                        r"profiles|bundles|shared)/[\w./-]*[\w/])(?![\w*<])")


def _named_paths(text: str) -> set[str]:
    out = set()
    for p in _REPO_PATH.findall(text):
        p = p.rstrip(".")
        if "*" in p or "<" in p or p.startswith("sim/commands/"):
            continue
        out.add(p)
    return out


def test_the_readme_names_only_files_in_the_repository():
    # ../shared (the project's reference folder beside a checkout) is named as such
    text = README.replace("../shared", "")
    missing = sorted(p for p in _named_paths(text) if not (ROOT / p).exists()
                     and not (ROOT / p.split(" ")[0]).exists())
    assert not missing, f"README names paths that are not in the repository: {missing}"


def test_help_texts_name_only_files_in_the_repository():
    import contextlib
    import io

    import cli

    _, handlers = cli.build_parser()
    missing = []
    for name in handlers:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
            cli.main([name, "--help"])
        missing += [f"{name} --help: {p}" for p in _named_paths(buf.getvalue())
                    if not (ROOT / p).exists()]
    assert not missing, missing
