"""`hicache-sim import DUMP -o DIR`: an SGLang crash dump or request-dump folder in."""

from __future__ import annotations

NAME = "import"
HELP = ("Read an SGLang 0.5.23 crash dump (or a dump_requests_folder) safely and write a "
        "scenario, its trace and the server args it could not map.")


def add_arguments(p) -> None:
    p.add_argument("dump", help="crash_dump_*.pkl, or a dump_requests_folder of *.pkl files")
    p.add_argument("-o", "--out", required=True, help="output folder (scenario.yaml, trace.jsonl, "
                   "unmapped.json, import.json)")
    p.add_argument("--name", help="scenario name (default: from the dump's file name)")
    p.add_argument("--model", metavar="PRESET",
                   help="model preset, when the dump's ModelConfig is missing or to override it")
    p.add_argument("--profile", help="cost profile (the dump does not say which GPU)")
    p.add_argument("--max-bytes", type=int, default=None,
                   help="refuse a dump file larger than this (default 1 GiB)")
    p.add_argument("--max-items", type=int, default=None,
                   help="refuse a dump of more pickle opcodes than this (default 2**28)")


def run(args) -> int:
    from sim.errors import UserError
    from sim.imports import build, crashdump, unpickle

    kw = {}
    for flag, key, default in (("--max-bytes", "max_bytes", unpickle.MAX_BYTES),
                               ("--max-items", "max_items", unpickle.MAX_ITEMS)):
        v = getattr(args, key)
        if v is not None and v <= 0:
            raise UserError(f"{flag} {v}; expected a positive integer")
        kw[key] = v or default
    if args.model is not None:
        from sim.costs import MODEL_PRESETS
        if args.model not in MODEL_PRESETS:
            raise UserError(f"--model {args.model!r}; expected one of {', '.join(MODEL_PRESETS)}")
    dump = crashdump.read(args.dump, **kw)
    s = build.write(dump, args.out, name=args.name, model=args.model, profile=args.profile)
    print(f"imported {s['requests']} requests ({s['finished']} finished, {len(s['skipped'])} "
          f"skipped) at TP {s['tp_size']}, {len(s['mapped'])} server args mapped -> "
          f"{args.out}/scenario.yaml")
    return 0
