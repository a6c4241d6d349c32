"""A restricted unpickler for SGLang's dump files: plain stand-ins, nothing imported.

A pickle names callables (``GLOBAL`` / ``STACK_GLOBAL``) that a plain ``pickle.load``
imports and calls: loading a stranger's file runs whatever it names. SGLang's crash
dumps (``TokenizerManager.dump_requests_before_crash``) and request dumps
(``TokenizerManager.dump_requests``, managers/tokenizer_manager.py) are plain
``pickle.dump`` output, so this module reads them under three guards:

1. **Bounded before anything runs.** The file is read up to ``max_bytes``; then
   ``pickletools.genops`` (a parser, it builds no object) walks every opcode: a
   truncated or malformed stream, more than ``max_items`` opcodes (each pushes at most
   one element: the bound on elements), or a name outside the allowlist is refused
   here, before one object is built.
2. **Only stand-ins.** ``find_class`` answers the allowlist with this module's plain
   classes (``StandIn`` subclasses, which only store what they are given); every
   other name is refused. No module a file names is imported, none of its code runs.
   ``persistent_load`` is refused.
3. **Bounded depth.** The loaded value is walked iteratively and refused past
   ``max_depth`` nested containers (later code may recurse over it).

The allowlist is what 0.5.23's dumps really hold (found by building dumps with
SGLang's own code: tools/sglang_dumps/make_dumps.py): the request and server-args
types, the server-args rebuild function, and the objects ``ServerArgs.__reduce__``
carries in its bookkeeping (the ``ModelConfig`` and its HuggingFace config, cuda-graph
and embedding-spec records, enums, a torch dtype). No builtin is needed (sets,
tuples, dicts and lists are opcodes, not globals).
"""

from __future__ import annotations

import io
import pickle
import pickletools
import re

from sim.errors import UserError

# Far above a real dump (5 minutes of requests: SGLang keeps 300 s, tokenizer_manager
# record_request_for_crash_dump), low enough to read on a laptop.
MAX_BYTES = 1 << 30
MAX_ITEMS = 1 << 28
MAX_DEPTH = 64


class StandIn:
    """A plain record for one of SGLang's classes: the state it was pickled with, as
    attributes, and the name it stood for. It has no behaviour."""

    sglang_name = ""

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.__dict__["_args"] = args
        return obj

    def __init__(self, *args, **kwargs):
        self._store(kwargs)

    def __setstate__(self, state):
        # object.__reduce_ex__ gives a dict, or (dict, slots dict) for slotted classes.
        if isinstance(state, tuple) and len(state) == 2:
            for part in state:
                if isinstance(part, dict):
                    self._store(part)
        elif isinstance(state, dict):
            self._store(state)
        else:
            self.__dict__["_state"] = state

    def _store(self, fields: dict) -> None:
        # A field may not shadow this class's own attributes (``get``) or a dunder:
        # the reader calls them, and the file must not choose what they are.
        for k in fields:
            if not isinstance(k, str) or k.startswith("__") or hasattr(StandIn, k):
                raise pickle.UnpicklingError(f"gives {self.sglang_name} a field {str(k)[:40]!r}, "
                                             "which no SGLang dump type has")
        self.__dict__.update(fields)

    def get(self, name, default=None):
        return self.__dict__.get(name, default)

    def __repr__(self):
        return f"<stand-in for {self.sglang_name}>"


def _stand_in(qualname: str) -> type:
    return type(qualname.rpartition(".")[2], (StandIn,), {"sglang_name": qualname})


class GenerateReqInput(StandIn):
    sglang_name = "sglang.srt.managers.io_struct.GenerateReqInput"


class EmbeddingReqInput(StandIn):
    sglang_name = "sglang.srt.managers.io_struct.EmbeddingReqInput"


class ServerArgs(StandIn):
    """``ServerArgs``' fields (``msgspec.structs.asdict``) as ``fields``."""

    sglang_name = "sglang.srt.server_args.ServerArgs"


def _rebuild_server_args(cls, fields, bookkeeping):
    """Stands for server_args._rebuild_server_args: keeps the field values only."""
    if cls is not ServerArgs or not isinstance(fields, dict):
        raise pickle.UnpicklingError("_rebuild_server_args called without ServerArgs' fields")
    obj = ServerArgs()
    obj.__dict__["fields"] = fields
    if isinstance(bookkeeping, dict):
        # The resolved ModelConfig (its HuggingFace config: the model's dimensions).
        obj.__dict__["model_config"] = bookkeeping.get("_model_config")
    return obj


class TorchDtype(str):
    """A torch dtype global (``torch.bfloat16``) as its name."""


_EXACT: dict[str, object] = {
    GenerateReqInput.sglang_name: GenerateReqInput,
    EmbeddingReqInput.sglang_name: EmbeddingReqInput,
    ServerArgs.sglang_name: ServerArgs,
    "sglang.srt.server_args._rebuild_server_args": _rebuild_server_args,
}
_STAND_INS: dict[str, type] = {}
# The objects ServerArgs.__reduce__ carries in its bookkeeping (``_model_config`` and
# what it holds): records, enums and HuggingFace configs, kept as opaque stand-ins.
_OPAQUE = (
    re.compile(r"sglang\.srt\.configs\.[a-z0-9_]+(\.[a-z0-9_]+)?\.[A-Z][A-Za-z0-9_]*\Z"),
    re.compile(r"sglang\.srt\.model_executor\.cuda_graph_config\.[A-Z][A-Za-z0-9_]*\Z"),
    re.compile(r"transformers\.models\.[a-z0-9_]+\.configuration_[a-z0-9_]+\.[A-Z][A-Za-z0-9_]*Config\Z"),
)
_DTYPES = frozenset(
    "float16 bfloat16 float32 float64 half float double int8 uint8 int16 int32 int64 bool "
    "float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float4_e2m1fn_x2".split())


def resolve(module: str, name: str):
    """The stand-in for ``module.name``; None when it is not allowed."""
    full = f"{module}.{name}"
    if full in _EXACT:
        return _EXACT[full]
    if module == "torch" and name in _DTYPES:
        return TorchDtype(full)
    if any(p.match(full) for p in _OPAQUE):
        return _STAND_INS.setdefault(full, _stand_in(full))
    return None


class Refused(UserError):
    """A dump this reader will not load: one line, exit 2."""


class _Restricted(pickle.Unpickler):
    def find_class(self, module, name):
        obj = resolve(module, name)
        if obj is None:
            raise pickle.UnpicklingError(f"names {module}.{name}, not one of SGLang's dump types")
        return obj

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("uses a persistent id, which SGLang's dumps never do")


_STR_OPS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE",
                      "SHORT_BINSTRING", "BINSTRING", "STRING"})


def _prescan(data: bytes, where: str, max_items: int) -> None:
    """Every opcode parsed (nothing built): bounds, and the names the stream uses."""
    memo: dict = {}
    last: list = []  # the last two pushed values where they are strings (else None)
    n = 0
    try:
        for op, arg, _pos in pickletools.genops(data):
            n += 1
            if n > max_items:
                raise Refused(f"more than {max_items:,} pickle opcodes; expected at most that many "
                              "elements (a bounded dump)", where=where)
            name = op.name
            if name in _STR_OPS:
                last.append(arg)
            elif name == "MEMOIZE":
                memo[len(memo)] = last[-1] if last else None
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = last[-1] if last else None
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                last.append(memo.get(arg))
            elif name in ("GLOBAL", "INST"):
                mod, _, qual = str(arg).partition(" ")
                _check_name(mod, qual, where)
                last.append(None)
            elif name == "STACK_GLOBAL":
                mod, qual = (last[-2], last[-1]) if len(last) >= 2 else (None, None)
                if not (isinstance(mod, str) and isinstance(qual, str)):
                    raise Refused("a STACK_GLOBAL whose name is not a literal string; "
                                  "expected SGLang's dump types only", where=where)
                _check_name(mod, qual, where)
                last.append(None)
            elif name in ("PERSID", "BINPERSID"):
                raise Refused("a persistent id; expected a plain pickle (SGLang's dumps have none)",
                              where=where)
            elif name in ("EXT1", "EXT2", "EXT4"):
                raise Refused("a copyreg extension code; expected SGLang's dump types only",
                              where=where)
            elif name not in ("PROTO", "FRAME", "MARK", "POP", "POP_MARK", "STOP"):
                last.append(None)
            if len(last) > 2:
                del last[:-2]
    except ValueError as err:  # genops: truncated stream, unknown opcode, bad argument
        raise Refused(f"not a complete pickle ({str(err).splitlines()[0][:80]}); expected a "
                      "whole crash or request dump (a truncated file?)", where=where) from None
    if n == 0:
        raise Refused("an empty file; expected a crash or request dump", where=where)


def _check_name(module: str, name: str, where: str) -> None:
    if resolve(module, name) is None:
        shown = f"{module}.{name}"
        shown = shown if len(shown) <= 100 else shown[:97] + "..."
        raise Refused(f"names {shown!r}, not one of SGLang's dump types; refused (nothing "
                      "was loaded or run)", where=where)


def _check_depth(obj, where: str, max_depth: int) -> None:
    stack = [(obj, 0)]
    seen: set[int] = set()
    while stack:
        o, d = stack.pop()
        if isinstance(o, (list, tuple, dict, set, frozenset, StandIn)):
            if d > max_depth:
                raise Refused(f"containers nested deeper than {max_depth}; expected a dump "
                              "of requests (a few levels)", where=where)
            if id(o) in seen:
                continue
            seen.add(id(o))
            if isinstance(o, dict):
                items = o.values()
            elif isinstance(o, StandIn):
                items = o.__dict__.values()
            else:
                items = o
            for v in items:
                if isinstance(v, (list, tuple, dict, set, frozenset, StandIn)):
                    stack.append((v, d + 1))


def loads(data: bytes, where: str, *, max_items: int = MAX_ITEMS, max_depth: int = MAX_DEPTH):
    """The dump in ``data`` with stand-ins for SGLang's classes, or :class:`Refused`."""
    _prescan(data, where, max_items)
    try:
        obj = _Restricted(io.BytesIO(data)).load()
    except pickle.UnpicklingError as err:
        raise Refused(f"{err}; refused (nothing was run)", where=where) from None
    except (EOFError, ValueError, TypeError, AttributeError, KeyError, IndexError,
            MemoryError, RecursionError, OverflowError) as err:
        raise Refused(f"a malformed pickle ({type(err).__name__}: {str(err)[:80]}); expected a "
                      "crash or request dump written by SGLang", where=where) from None
    _check_depth(obj, where, max_depth)
    return obj
