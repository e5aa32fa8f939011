"""The domain of a config field: its type, range, finiteness and allowed values, declared next to its default.

Every field of the job's dataclasses (``mpirl/config.py``) is declared with
:func:`setting`, e.g. ``lr: float = setting(1e-3, gt=0)``. :func:`check` is the
one function that holds a value against its domain; ``config.validate`` calls it
for every field before any rank starts, and the tests generate out-of-domain
values from the same declarations (:func:`outside`), so a new field cannot be
forgotten. Standard library only.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

INT_MAX = 2**63 - 1  # what HDF5 attributes, numpy and torch take for an int
EXIT_BAD_INPUT = 2  # what every command exits with on bad input (a field, a flag, a file), after one line


def bad_input(message: str) -> int:
    """One line on stderr naming the field (or flag) and the fix; the exit code a command returns for it."""
    print(f"mpirl: error: {message}", file=sys.stderr, flush=True)
    return EXIT_BAD_INPUT


class ConfigError(ValueError):
    """A bad job: ``key`` names the offending field, ``str(err)`` says the fix."""

    def __init__(self, key: str, message: str):
        self.key, self.message = key, message
        super().__init__(f"{key}: {message}" if key else message)

    def __reduce__(self):  # survives pickling, e.g. a broadcast from rank 0 to every rank
        return type(self), (self.key, self.message)


@dataclass(frozen=True)
class Domain:
    """Allowed values. Bounds: ``ge``/``gt``/``le``/``lt``; ``nan``: a float may be nan (meaning "off");
    ``choices``: the allowed strings; ``name``: a string that is one file-name component; ``text``: a
    non-empty string without control characters; ``items``: the domain of a list's elements;
    ``also``: strings a number field takes besides its numbers (``workers = "learner"``);
    ``why``: the reason appended to the message (e.g. "0 disables it")."""
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    nan: bool = False
    choices: tuple = ()
    name: bool = False
    text: bool = False
    items: "Domain | None" = None
    also: tuple = ()
    why: str = ""

    def describe(self, kind: type) -> str:
        """``"an int >= 1"``, ``"a number in (0, 1]"``, ``"one of 'a', 'b'"`` ..."""
        if self.choices:
            return "one of " + ", ".join(map(repr, self.choices))
        if kind is list:
            return f"a non-empty list, each {self.items.describe(int)}" if self.items else "a list"
        noun = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}[kind]
        if self.name:
            return "a non-empty name of at most 200 characters without '/' or control characters"
        if self.text:
            return "a non-empty string without control characters"
        lo = (f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}" if self.gt is not None else None)
        hi = (f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})" if self.lt is not None else None)
        if lo and hi:
            rng = f" in {lo}, {hi}"
        elif lo:
            rng = f" {'>=' if lo[0] == '[' else '>'} {lo[1:]}"
        elif hi:
            rng = f" {'<=' if hi[-1] == ']' else '<'} {hi[:-1]}"
        else:
            rng = ""
        return noun + rng + (" (or nan)" if self.nan else "") + "".join(f" or {v!r}" for v in self.also)


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def setting(default, **domain):
    """A dataclass field with its domain: ``setting(0.99, gt=0, le=1)``; a list default is copied per instance."""
    meta = {"domain": Domain(**domain)}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def _type_ok(value, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


def problem(value, kind: type, dom: Domain) -> str:
    """'' when ``value`` is in the domain, else what is wrong (without the key)."""
    want = dom.describe(kind) + (f" ({dom.why})" if dom.why else "")
    got = f"got {type(value).__name__} {value!r}"
    if dom.also and isinstance(value, str) and value in dom.also:
        return ""
    if not _type_ok(value, kind):
        return f"must be {want}, {got}"
    if kind is list:
        for item in value:
            if dom.items and problem(item, int, dom.items):
                return f"must be {want}, {got}"
        return "" if value or not dom.items else f"must be {want}, {got}"
    if kind is str:
        if dom.choices and value not in dom.choices:
            return f"must be {want}, {got}"
        bad_chars = any(ord(ch) < 32 or ord(ch) == 127 for ch in value)
        if (dom.name or dom.text) and (not value or bad_chars):
            return f"must be {want}, {got}"
        if dom.name and ("/" in value or len(value) > 200 or value in (".", "..")):
            return f"must be {want}, {got}"
        return ""
    if kind is bool:
        return ""
    if kind is float and math.isnan(value):
        return "" if dom.nan else f"must be {want}, {got}"
    if kind is float and math.isinf(value):
        return f"must be {want}, {got}"
    if kind is int and not -INT_MAX <= value <= INT_MAX:
        return f"must be {want} that fits 64 bits, {got}"
    if ((dom.ge is not None and not value >= dom.ge) or (dom.gt is not None and not value > dom.gt)
            or (dom.le is not None and not value <= dom.le) or (dom.lt is not None and not value < dom.lt)):
        return f"must be {want}, {got}"
    return ""


def outside(kind: type, dom: Domain) -> list:
    """Values outside the domain, one per way to leave it (for the tests that walk every field)."""
    out: list = []
    if kind is bool:
        return [1, "yes"]
    if kind is list:
        out.append("x")
        if dom.items:  # a list holding one element outside the elements' domain, and the empty list
            out += [[v] for v in outside(int, dom.items)] + [[]]
        return out
    if kind is str:
        out.append(7)
        if dom.choices:
            out.append("no-such-choice")
        if dom.name:
            out += ["", "a/b", "a\x00b", "x" * 201, ".."]
        if dom.text:
            out += ["", "a\nb"]
        return out
    out += ["x", True]
    if kind is int:
        out += [1.5, 2**64]
    else:
        out += [math.inf, -math.inf] + ([] if dom.nan else [math.nan])
    step = 1 if kind is int else 1e-3
    for bound, delta in ((dom.ge, -step), (dom.gt, 0), (dom.le, step), (dom.lt, 0)):
        if bound is not None:
            out.append(type(bound)(bound + delta) if kind is int else float(bound) + delta)
    return out
