"""Safe, bounded YAML: the one YAML loader for every file a user hands us.

``yaml.safe_load`` builds no objects, but it still accepts three things a scenario
must not: a key given twice (``tp: 2`` then ``tp: 4`` silently means 4), an integer
of thousands of digits (Python refuses to convert it and raises outside PyYAML's
error types) and an alias bomb (nine lines whose aliases expand to billions of
values, which every later walk then visits). :func:`load` rejects all three with one
line naming the file and line.
"""

from __future__ import annotations

import yaml

from sim.errors import UserError

# Expanded values (every alias counted as a copy of its anchor's subtree). A real
# scenario or sweep has a few hundred; a list of a million values is already absurd.
MAX_NODES = 1_000_000
# Integer literals: far beyond any count or seed (2**63 has 19 digits).
MAX_INT_DIGITS = 40


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and oversized integers."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None,
                        f"found key {key_node.value!r} twice (first on line {seen[key] + 1}); "
                        "expected each key once", key_node.start_mark)
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        text = str(node.value)
        digits = sum(c.isdigit() for c in text)
        if digits > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"found an integer of {digits} digits; expected at most "
                f"{MAX_INT_DIGITS} digits", node.start_mark)
        return super().construct_yaml_int(node)


    def construct_yaml_binary(self, node):
        # A schema string field takes bytes as text, so `name: !!binary aGk=` became
        # the name "hi": no key of ours holds binary data.
        raise yaml.constructor.ConstructorError(
            None, None, "found a !!binary value; expected plain YAML (a number, string, "
            "boolean, null, list or mapping)", node.start_mark)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:binary", _Loader.construct_yaml_binary)


def _check_size(root, where: str) -> None:
    """Reject a node graph whose expansion exceeds MAX_NODES, or that contains itself."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        nid = id(node)
        if done:
            on_path.discard(nid)
            if isinstance(node, yaml.SequenceNode):
                kids = node.value
            elif isinstance(node, yaml.MappingNode):
                kids = [x for kv in node.value for x in kv]
            else:
                kids = []
            n = 1 + sum(size[id(k)] for k in kids)
            if n > MAX_NODES:
                raise UserError(f"found YAML whose anchors and aliases expand to over {MAX_NODES:,} "
                                "values; expected a plain scenario-sized document",
                                where=f"{where}:{node.start_mark.line + 1}")
            size[nid] = n
            continue
        if nid in size:
            continue
        if nid in on_path:
            raise UserError("found a YAML alias that contains itself; expected a finite document",
                            where=f"{where}:{node.start_mark.line + 1}")
        on_path.add(nid)
        stack.append((node, True))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((k, False) for k in node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend((x, False) for kv in node.value for x in kv)


def _flat(s) -> str:
    return " ".join(str(s).split())


def load(text: str, where: str, expected: str = "a YAML mapping"):
    """Parse one YAML document safely; every problem is one UserError line."""
    loader = None
    try:
        loader = _Loader(text)  # the reader already rejects control characters here
        node = loader.get_single_node()
        if node is None:
            return None
        _check_size(node, where)
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        loc = f"{where}:{mark.line + 1}" if mark is not None else where
        problem = _flat(getattr(err, "problem", None) or type(err).__name__)
        if problem.startswith("found ") and "expected" in problem:
            raise UserError(problem, where=loc) from None
        raise UserError(f"found invalid YAML ({problem}); expected {expected}", where=loc) from None
    except RecursionError:
        raise UserError(f"found YAML nested too deep; expected {expected}", where=where) from None
    except ValueError as err:  # e.g. a number Python cannot convert
        raise UserError(f"found an unreadable value ({_flat(err)[:80]}); expected {expected}",
                        where=where) from None
    finally:
        if loader is not None:
            loader.dispose()
