"""Regenerate the README's figures from the runs that make them (``make figures``).

``docs/img/figures.yaml`` is the manifest: per figure, the commands that make it and
the file they leave. Each figure's commands run from the repository root into
``results/figures/`` (``{out}``), and the file is copied to ``docs/img/<figure>`` with
the commands in its PNG "Source" text, so every image says where it came from.

    python tools/figures.py                 # all of them (several minutes)
    python tools/figures.py --only capacity_sweep.png
    python tools/figures.py --list          # figure -> commands
    python tools/figures.py --check         # the manifest, docs/img/ and the README agree

"hicache-sim" in a command runs this checkout's ``cli.py``, "python" this interpreter.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "docs" / "img" / "figures.yaml"
IMG = ROOT / "docs" / "img"
SCRATCH = ROOT / "results" / "figures"


def load(path: Path = MANIFEST) -> list[dict]:
    import yaml

    entries = yaml.safe_load(path.read_text())
    for e in entries:
        missing = {"figure", "commands", "file"} - set(e)
        if missing:
            raise SystemExit(f"{path}: {e.get('figure', '?')}: found no {', '.join(sorted(missing))}; "
                             "expected figure, commands and file")
    return entries


def argv(command: str, out: Path) -> list[str]:
    """A manifest command as the argv this checkout runs."""
    args = shlex.split(command.replace("{out}", str(out)))
    if args[0] == "hicache-sim":
        return [sys.executable, str(ROOT / "cli.py"), *args[1:]]
    if args[0] == "python":
        return [sys.executable, *args[1:]]
    raise SystemExit(f"{MANIFEST}: found the command {args[0]!r}; expected hicache-sim or python")


def check(entries: list[dict], readme: str) -> list[str]:
    """What disagrees: a README image without a manifest entry, an entry the README
    does not show, or an entry whose image is not in docs/img/."""
    shown = set(re.findall(r"\(docs/img/([^)\s]+\.png)\)", readme))
    listed = {e["figure"] for e in entries}
    problems = [f"docs/img/{f}: shown in the README but not in {MANIFEST.name}" for f in sorted(shown - listed)]
    problems += [f"{MANIFEST.name}: {f} is not shown in the README" for f in sorted(listed - shown)]
    problems += [f"docs/img/{f}: listed in {MANIFEST.name} but missing" for f in sorted(listed)
                 if not (IMG / f).is_file()]
    return problems


def stamp(src: Path, dst: Path, commands: list[str]) -> None:
    """Copy the PNG ``src`` to ``dst`` with the commands that made it in its text."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("Source", " && ".join(commands))
    info.add_text("Software", "hicache-sim (make figures, docs/img/figures.yaml)")
    with Image.open(src) as im:
        im.save(dst, pnginfo=info)


def build(entry: dict) -> None:
    out = SCRATCH
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for command in entry["commands"]:
        print(f"[{entry['figure']}] {' '.join(command.replace('{out}', str(out)).split())}", flush=True)
        p = subprocess.run(argv(command, out), cwd=ROOT)
        if p.returncode != 0:
            raise SystemExit(f"make figures: {entry['figure']}: the command exited {p.returncode}; "
                             "nothing copied")
    src = out / entry["file"]
    if not src.is_file():
        raise SystemExit(f"make figures: {entry['figure']}: found no {src}; expected the "
                         "commands to write it")
    stamp(src, IMG / entry["figure"], [" ".join(c.split()) for c in entry["commands"]])
    for extra in entry.get("also", ()):
        shutil.copyfile(out / extra, IMG / Path(extra).name)
    print(f"[{entry['figure']}] written docs/img/{entry['figure']} ({time.perf_counter() - t0:.0f} s); "
          f"re-read the README's \"{entry.get('readme', '')}\" numbers against this run", flush=True)


def main(argv_: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], metavar="FIGURE",
                    help="one figure (its file name, with or without .png); repeatable")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true", help="print each figure and its commands")
    mode.add_argument("--check", action="store_true",
                      help="check the manifest against docs/img/ and the README; run nothing")
    args = ap.parse_args(argv_)
    entries = load()
    if args.check:
        problems = check(entries, (ROOT / "README.md").read_text())
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    names = {e["figure"]: e for e in entries}
    wanted = [o if o.endswith(".png") else f"{o}.png" for o in args.only]
    unknown = [w for w in wanted if w not in names]
    if unknown:
        print(f"figures: found {unknown[0]!r}; expected one of {', '.join(names)}", file=sys.stderr)
        return 2
    chosen = [names[w] for w in wanted] or entries
    if args.list:
        for e in chosen:
            print(f"{e['figure']} (about {e.get('minutes', '?')} min):")
            for c in e["commands"]:
                print(f"    {' '.join(c.split())}")
        return 0
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    for e in chosen:
        build(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
