"""`hicache-sim calibrate`: measure host<->device copies and write a cost profile.

The measuring and fitting live in ``sim.costs.calibrate``; this module parses flags.
numpy and torch are imported only when the command runs, not when the CLI starts.
"""

from __future__ import annotations

import re

from sim.errors import UserError

NAME = "calibrate"
HELP = "measure real copies with torch (CUDA or CPU) and write a fitted cost profile"

_SIZE = re.compile(r"^(\d+)([kmg]?)(i?b)?$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str, flag: str = "--sizes") -> int:
    """Bytes from '4096', '64K', '16MiB', '1G' (binary units)."""
    match = _SIZE.match(text.strip())
    if not match or int(match.group(1)) <= 0:
        raise UserError(f"found {text!r}; expected a positive size such as 4096, 64K, 16M or 1G",
                        where=flag)
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def parse_count(text: str, flag: str = "--pages") -> int:
    if not text.isdigit() or int(text) <= 0:
        raise UserError(f"found {text!r}; expected a positive integer", where=flag)
    return int(text)


def add_arguments(parser) -> None:
    parser.add_argument("--device", required=True, choices=("cuda", "cpu"),
                        help="where to measure: cuda (pinned host buffers, CUDA events) or"
                             " cpu (the same code path on CPU tensors)")
    parser.add_argument("--out", required=True, metavar="PROFILE.yaml",
                        help="where to write the fitted profile (atomically)")
    parser.add_argument("--base", default="h200-sxm", metavar="PROFILE",
                        help="profile name or path for the parameters not measured"
                             " (default: h200-sxm)")
    parser.add_argument("--sizes", nargs="+", metavar="SIZE",
                        help="single-copy sizes for the bandwidth/latency sweep, e.g."
                             " 64K 1M 16M 256M (default depends on --device)")
    parser.add_argument("--pages", nargs="+", metavar="K",
                        help="numbers of small page copies for the per-call sweep, e.g."
                             " 1 16 256 (default depends on --device)")
    parser.add_argument("--page-bytes", metavar="SIZE",
                        help="bytes per page copy in the per-call sweep (default 4K)")
    parser.add_argument("--repeats", metavar="N",
                        help="timed repeats per point; the median is kept")
    parser.add_argument("--concurrent-bytes", metavar="SIZE",
                        help="bytes per copy in the concurrent H2D+D2H test")
    parser.add_argument("--name", help="profile name written into the file (default: the"
                                       " output file's stem)")


def run(args) -> int:
    from sim.paths import is_slug

    if args.name is not None and not is_slug(args.name):
        raise UserError(f"found {args.name!r}; expected a profile name: letters, digits, '_', "
                        "'.' and '-', at most 200 characters", where="--name")
    sizes = [parse_size(s, "--sizes") for s in args.sizes] if args.sizes else None
    pages = [parse_count(k, "--pages") for k in args.pages] if args.pages else None
    for flag, values in (("--sizes", sizes), ("--pages", pages)):
        if values is not None and len(set(values)) < 2:
            raise UserError(f"found {len(set(values))} distinct value(s); expected at least 2"
                            " to fit a line", where=flag)
    page_bytes = parse_size(args.page_bytes, "--page-bytes") if args.page_bytes else None
    repeats = parse_count(args.repeats, "--repeats") if args.repeats else None
    concurrent = (parse_size(args.concurrent_bytes, "--concurrent-bytes")
                  if args.concurrent_bytes else None)

    from sim.costs.calibrate import calibrate  # numpy/torch only when measuring

    calibrate(args.device, args.out, base=args.base, sizes=sizes, pages=pages,
              page_bytes=page_bytes, repeats=repeats, concurrent_bytes=concurrent,
              name=args.name)
    return 0
