"""Input checks for op-trace lines beyond the core format (``sim.optrace`` calls them).

What this is for: ``sim.optrace.parse_line`` checks the fields SGLang's format
defines; the header extensions hicache-sim's bundles write (``ids``,
``host_policy``, ``eviction_policy``, ``host_alloc_failures``) and the ``skip_ids``
op were taken as given, so a wrong type or value surfaced as a traceback deep in the
tree, or silently (a negative ``skip_ids`` gives two nodes one id). Every check
here raises :class:`InputFormatError` naming the file and line.
"""

from __future__ import annotations

import json

from sim.errors import InputFormatError
from sim.policies.eviction import EVICTION_POLICIES
from sim.policies.host import HOST_POLICIES
from sim.storage.policy import HOST_MEMORY_MODES  # one list of modes: the storage tier's
from sim.tree import ID_SCHEMES  # one list of id schemes: the tree's

# The trace format's header versions (docs/OPTRACE.md §1) and its vocabulary, here with
# the checks that read them (``sim.optrace`` imports them from here).
VERSIONS = (1, 2)
# Ops that need a version 2 header (docs/OPTRACE.md §1, §14).
STORAGE_OPS = ("prefetch", "prefetch_hit", "prefetch_done", "prefetch_revoke",
               "storage_write", "storage_write_ack", "buffer_stage", "pin", "unpin")
# When write_through backups are acknowledged: v1's reference replayer acks at the
# end of the issuing op; v2 traces default to the engine's explicit write_ack ops.
WRITE_ACKS = ("end_of_op", "op")

# Bounds on every count in a trace: far above any real tree, low enough that the
# tree's arithmetic stays in ordinary ints.
MAX_COUNT = 10**15
# The scenario schema's bound on page_size: a page of 10**9 tokens makes every key
# shorter than one page, so a trace would replay to an empty tree without a word.
MAX_PAGE_SIZE = 1 << 16
# What a buffer_only tree never sees (docs/OPTRACE.md §15): §14's storage ops.
CACHE_MODE_STORAGE_OPS = ("prefetch", "prefetch_hit", "prefetch_done", "prefetch_revoke",
                          "storage_write", "storage_write_ack")
MAX_ALLOC_FAILURES = 10**7


def _short(value) -> str:
    try:
        text = json.dumps(value) if not isinstance(value, str) else repr(value)
    except (ValueError, TypeError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def load_line(path, line_no: int, text: str):
    """One line's JSON value; invalid JSON, huge integers or deep nesting as one line."""
    try:
        return json.loads(text)
    except RecursionError:
        raise InputFormatError(path, line_no, "JSON nested too deep", "one flat JSON object per line") from None
    except ValueError as err:
        msg = getattr(err, "msg", None) or " ".join(str(err).split())[:80]
        raise InputFormatError(path, line_no, f"invalid JSON ({msg})", "one JSON object per line") from None


def check_header(path, line_no: int, obj: dict) -> None:
    """The header's extension fields and the size of its counts."""
    if "version" in obj and (type(obj["version"]) is not int or obj["version"] not in VERSIONS):
        raise InputFormatError(path, line_no, f"version={_short(obj['version'])}",
                               f"'version' one of {', '.join(map(str, VERSIONS))}")
    if "write_acks" in obj:
        v = obj["write_acks"]
        if obj.get("version", 1) < 2:
            raise InputFormatError(path, line_no, f"write_acks={_short(v)} in a version 1 header",
                                   "'write_acks' only with \"version\": 2")
        if not isinstance(v, str) or v not in WRITE_ACKS:
            raise InputFormatError(path, line_no, f"write_acks={_short(v)}",
                                   f"'write_acks' one of {', '.join(WRITE_ACKS)}")
    if "storage_writes" in obj:
        v = obj["storage_writes"]
        if obj.get("version", 1) < 2:
            raise InputFormatError(path, line_no, f"storage_writes={_short(v)} in a version 1 header",
                                   "'storage_writes' only with \"version\": 2")
        if v not in ("op", "auto"):
            raise InputFormatError(path, line_no, f"storage_writes={_short(v)}",
                                   "'storage_writes' one of op, auto")
    if "host_memory_mode" in obj:
        v = obj["host_memory_mode"]
        if obj.get("version", 1) < 2 or not isinstance(v, str) or v not in HOST_MEMORY_MODES:
            raise InputFormatError(path, line_no, f"host_memory_mode={_short(v)}",
                                   f"'host_memory_mode' one of {', '.join(HOST_MEMORY_MODES)} "
                                   "in a version 2 header")
    if obj.get("host_memory_mode") == "buffer_only" and "storage_writes" in obj:
        raise InputFormatError(path, line_no, "storage_writes in a buffer_only header",
                               "no storage_writes under host_memory_mode buffer_only "
                               "(docs/OPTRACE.md §15)")
    ps = obj.get("page_size")
    if type(ps) is int and ps > MAX_PAGE_SIZE:
        raise InputFormatError(path, line_no, f"page_size={_short(ps)}",
                               f"'page_size' of at most {MAX_PAGE_SIZE}")
    for key in ("device_capacity", "host_capacity", "page_size", "load_back_threshold",
                "prefetch_threshold"):
        v = obj.get(key)
        if type(v) is int and v > MAX_COUNT:
            raise InputFormatError(path, line_no, f"{key}={_short(v)}", f"'{key}' of at most {MAX_COUNT}")
    for key, names in (("ids", ID_SCHEMES), ("host_policy", tuple(HOST_POLICIES)),
                       ("eviction_policy", tuple(EVICTION_POLICIES))):
        if key in obj and (not isinstance(obj[key], str) or obj[key] not in names):
            raise InputFormatError(path, line_no, f"{key}={_short(obj[key])}", f"'{key}' one of {', '.join(names)}")
    if "host_alloc_failures" in obj:
        v = obj["host_alloc_failures"]
        expected = "'host_alloc_failures' as a list of [op index, attempt] pairs of non-negative ints"
        if not isinstance(v, list) or len(v) > MAX_ALLOC_FAILURES:
            raise InputFormatError(path, line_no, f"host_alloc_failures={_short(v)}", expected)
        for pair in v:
            if not (isinstance(pair, list) and len(pair) == 2
                    and all(type(x) is int and 0 <= x <= MAX_COUNT for x in pair)):
                raise InputFormatError(path, line_no, f"host_alloc_failures element {_short(pair)}", expected)


def check_op(path, line_no: int, obj: dict, header: dict | None = None) -> None:
    """Counts of an operation line: non-negative where negative makes no sense, bounded;
    v2-only ops only under a header that allows them."""
    if obj.get("op") == "write_ack" and header is not None:
        if header.get("version", 1) < 2:
            raise InputFormatError(path, line_no, "a write_ack op in a version 1 trace",
                                   'a header with "version": 2 (docs/OPTRACE.md)')
        if header.get("write_acks", "op") != "op":
            raise InputFormatError(path, line_no, f"a write_ack op under write_acks={_short(header['write_acks'])}",
                                   'write_acks "op" (or no write_ack ops)')
    if header is not None and header.get("version", 1) < 2:
        if obj.get("op") in STORAGE_OPS:
            raise InputFormatError(path, line_no, f"a {obj['op']} op in a version 1 trace",
                                   'a header with "version": 2 (docs/OPTRACE.md §14)')
    if (header is not None and header.get("host_memory_mode") == "buffer_only"
            and obj.get("op") in CACHE_MODE_STORAGE_OPS):
        raise InputFormatError(path, line_no, f"a {obj['op']} op in a buffer_only trace",
                               "only buffer_stage, write_ack, pin and unpin besides the tree's "
                               "ops under host_memory_mode buffer_only (docs/OPTRACE.md §15)")
    n = obj.get("n")
    if type(n) is int and abs(n) > MAX_COUNT:
        raise InputFormatError(path, line_no, f"n={_short(n)}", f"'n' of at most {MAX_COUNT}")
    if obj.get("op") == "skip_ids" and type(n) is int and n < 0:
        # Going back would hand out ids that live nodes already have.
        raise InputFormatError(path, line_no, f"n={n}", "'n' >= 0 (ids only move forward)")
    if obj.get("op") in ("prefetch_hit", "prefetch_done", "evict_device", "evict_host") \
            and type(n) is int and n < 0:
        raise InputFormatError(path, line_no, f"n={n}", "'n' >= 0 (tokens)")
    r = obj.get("reserved")
    if type(r) is int and r > MAX_COUNT:
        raise InputFormatError(path, line_no, f"reserved={_short(r)}", f"'reserved' of at most {MAX_COUNT}")
