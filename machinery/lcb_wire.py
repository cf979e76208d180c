"""machinery/lcb_wire.py: values across the sandbox wall, for machinery/lcb.py's harnesses.

The candidate runs in a child process; the verdict is made in the parent, on the values the child sends back
(lcb.py's module docstring says why). This file holds both ends of that wire: `_WIRE_SRC`, the encoder pasted
into every child program (the child cannot import this module: bwrap hides the checkout) and run here too, and
the parent's decoding of what came back (opaque objects, linked lists and trees as their values, one record per
test, the records' size cap). Apart from lcb.py so that the graders there read without it; lcb.py imports these
names, and nothing else does. A leaf: no project module.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

# ---------------------------------------------------------------------------------------------------
# Values across the sandbox wall. The candidate runs in the child; the verdict is made here, in the
# parent, on the values the child sends back. The child never holds an expected value, so nothing it
# can read (its own code objects, its callers' frames, its stdin) tells it what would pass.
# ---------------------------------------------------------------------------------------------------

# Shared by the parent (exec'd below) and the child (pasted into its program: the child cannot import
# this module, bwrap hides the checkout). _w_enc writes a value as JSON with one-key type tags, so a
# tuple stays a tuple, dict keys keep their types and huge ints survive; _w_dec reads it back and hands
# the tags it does not know to `special`. Subclasses of plain types that keep their base's `==` travel
# as the base, read through the base's own methods (an overridden __iter__ cannot lie about the value);
# anything else is opaque ({"x": type name}) and equals nothing here. numpy scalars travel as their
# Python values, as they compare with them.
_WIRE_SRC = r'''
import collections as _w_col, json as _w_json, os as _w_os, sys as _w_sys

_W_SCALARS = ((int, int.__int__), (float, float.__float__), (str, str.__str__))
_W_SEQS = ((list, None), (tuple, "t"), (set, "s"), (frozenset, "f"), (_w_col.deque, "q"))


def _w_enc(x, depth=0):
    if depth > 10000:
        raise ValueError("a value nested too deep to grade")
    t, d = type(x), depth + 1
    if x is None or t is bool or t is str or t is float:
        return x
    if t is int:
        return x if x.bit_length() < 10000 else {"h": hex(x)}  # decimal strings of huge ints are capped
    if t is list:
        return [_w_enc(v, d) for v in x]
    np = _w_sys.modules.get("numpy")
    if np is not None and isinstance(x, np.generic):
        v = x.item()
        return {"x": t.__name__} if isinstance(v, np.generic) else _w_enc(v, d)
    if np is not None and isinstance(x, np.ndarray):  # `==` gives an array, whose truth is its one element
        return {"a": _w_enc(x.item(), d)} if x.size == 1 else {"x": "ndarray"}
    if t is complex:
        return {"c": [x.real, x.imag]}
    if t is bytes:
        return {"b": x.hex()}
    if t is _w_col.Counter or t is _w_col.OrderedDict:  # against a plain dict these compare as dicts
        return {"d": [[_w_enc(k, d), _w_enc(v, d)] for k, v in dict.items(x)]}
    for base, read in _W_SCALARS:
        if isinstance(x, base):
            return _w_enc(read(x), d) if t.__eq__ is base.__eq__ else {"x": t.__name__}
    if isinstance(x, dict):
        if t.__eq__ is not dict.__eq__:
            return {"x": t.__name__}
        return {"d": [[_w_enc(k, d), _w_enc(v, d)] for k, v in dict.items(x)]}
    for base, tag in _W_SEQS:
        if isinstance(x, base):
            if t.__eq__ is not base.__eq__:
                return {"x": t.__name__}
            items = [_w_enc(v, d) for v in base.__iter__(x)]
            return items if tag is None else {tag: items}
    return {"x": t.__name__}


def _w_dec(o, special):
    if type(o) is list:
        return [_w_dec(v, special) for v in o]
    if type(o) is not dict:
        return o
    if len(o) != 1:
        raise ValueError("a wire value is tagged by exactly one key")
    (tag, v), = o.items()
    if tag == "t":
        return tuple(_w_dec(e, special) for e in v)
    if tag == "s":
        return {_w_dec(e, special) for e in v}
    if tag == "f":
        return frozenset(_w_dec(e, special) for e in v)
    if tag == "q":
        return _w_col.deque(_w_dec(e, special) for e in v)
    if tag == "d":
        return {_w_dec(k, special): _w_dec(e, special) for k, e in v}
    if tag == "h":
        return int(v, 16)
    if tag == "c":
        return complex(v[0], v[1])
    if tag == "b":
        return bytes.fromhex(v)
    return special(tag, v)


def _w_emit(fd, cap, i, status, payload):
    """One record [index, status, payload] a line on the results channel; a record over `cap` characters
    (a constant of the run, not of the answer) is sent as an opaque value."""
    line = _w_json.dumps([i, status, payload])
    if len(line) > cap:
        line = _w_json.dumps([i, status, {"x": "a value too long to send"}])
    data = (line + "\n").encode()
    while data:
        data = data[_w_os.write(fd, data):]
'''

_WIRE: dict = {}
exec(_WIRE_SRC, _WIRE)
_wire_enc, _wire_dec = _WIRE["_w_enc"], _WIRE["_w_dec"]


class _Opaque:
    """A returned object the grader does not compare (not a plain value): it equals nothing."""

    def __init__(self, name: str):
        self.name = name

    def __eq__(self, other):
        return False

    __hash__ = object.__hash__

    def __repr__(self):
        return f"<opaque {self.name}>"


@dataclass(frozen=True)
class _Chain:
    """A linked list as the values along it (None: the empty list)."""
    vals: tuple


@dataclass(frozen=True)
class _Tree:
    """A binary tree in LeetCode's level order: [val] per node, None per missing child, trailing Nones cut."""
    nodes: tuple


class _OneElementArray:
    """A returned one-element numpy array: `array == expected` broadcasts, and the truth of the result is
    that of its one element, so it equals a scalar or nested one-element lists holding an equal value."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        while isinstance(other, list) and len(other) == 1:
            other = other[0]
        return not isinstance(other, (list, dict)) and bool(self.value == other)

    __hash__ = object.__hash__


def _result_special(tag, v):
    if tag == "a":
        return _OneElementArray(_wire_dec(v, _result_special))
    if tag == "ln":
        return _Chain(tuple(_wire_dec(e, _result_special) for e in v))
    if tag == "tn":
        return _Tree(tuple(None if e is None else [_wire_dec(e[0], _result_special)] for e in v))
    if tag == "x":
        return _Opaque(str(v))
    raise ValueError(f"unknown wire tag {tag!r}")


def _decode_result(payload):
    return _wire_dec(payload, _result_special)


def _tree_of(values: list) -> _Tree:
    """What tree_node(values) builds (the prelude's level-order rule), in _Tree's canonical form."""
    if not values or values[0] is None:
        return _Tree(())
    root = [values[0], None, None]
    level, i = [root], 1
    for node in level:  # grows while we walk it
        for side in (1, 2):
            if i < len(values) and values[i] is not None:
                node[side] = [values[i], None, None]
                level.append(node[side])
            i += 1
        if i >= len(values):
            break
    out, queue = [], [root]
    for node in queue:
        if node is None:
            out.append(None)
        else:
            out.append([node[0]])
            queue += [node[1], node[2]]
    while out and out[-1] is None:
        out.pop()
    return _Tree(tuple(out))


def _read_records(stdout: str, n: int) -> list | None:
    """The payloads of the child's records 0..n-1, or None if one is missing or not "ok", or if the
    channel holds anything but records (the code wrote into it, or it was cut)."""
    got: dict = {}
    for line in stdout.split("\n"):
        if not line:
            continue
        try:
            i, status, payload = json.loads(line)
        except (ValueError, TypeError):
            return None
        if type(i) is not int or status not in ("ok", "error"):
            return None
        if got.setdefault(i, (status, payload)) != (status, payload):
            return None  # two different records for one case: the code forged one
    if any(got.get(i, ("missing",))[0] != "ok" for i in range(n)):
        return None
    return [got[i][1] for i in range(n)]


def _record_cap(sb, needs: list) -> int:
    """The most characters one result record may take. `needs` are the lengths of the expected values:
    the records of a correct answer (JSON, at most about twice as long) must fit the sandbox's stdout
    together, else this is a grader misconfiguration, not a wrong answer. The cap itself is rounded up to
    a power of two (at least 64K), so that it tells the code nothing about the expected values."""
    room = getattr(sb, "max_output_bytes", 1 << 62)
    total = sum(2 * k + 256 for k in needs)
    if total > room:
        raise ValueError(f"{len(needs)} test results of {sum(needs):,} characters in all do not fit the sandbox's "
                         f"max_output_bytes={room:,}; grade with Sandbox(max_output_bytes=...) above {total:,}")
    return max(1 << 16, 1 << (2 * max(needs, default=0) + 256).bit_length())
