"""Plain Python closures for the simple CEL conditions, with CEL's results: no ``cel.Context`` per decision.

Handing signals to common-expression-language costs more than evaluating them: a ``cel.Context``
converts every value of the CEL variables (``scripts/bench_decision.py --cel``, load average ~11: 41 µs
for a four-rule decision's pruned context, 0.7 µs a condition evaluated on it). Most conditions are comparisons of signal
fields joined by ``&&`` and ``||`` (``difficulty.p_hard >= variables.p_hard_frontier &&
request.prompt_tokens < 512``), which Python evaluates on the same variables (dicts) directly.

``closure(source) -> Condition | None``: ``source`` is the CEL text the policy compiled (relative
names already rewritten, ``CompiledRule.program.source``); None when it uses anything outside the
subset below (then the rule always runs on CEL). A ``Condition(variables, cost)`` takes the CEL
variables (namespace -> dict of fields, or key -> dict of fields) and the ``cost(target)`` function,
and returns True or False exactly when CEL would return that value, or ``DEFER`` for everything
else: a missing key or namespace, a null, NaN, a type CEL has no overload for (``1 + 2.0``, ``true ==
1``), an integer out of CEL's 64-bit range, a division by zero, ``cost()`` failing, a non-boolean
result. The caller then runs the rule on CEL, which gives the same value or the same error text as
without this module; so results, errors and their messages are CEL's, and a closure never decides
anything CEL would not. ``closures_agree_with_cel`` is a property test of that
(``tests/policy/test_closures.py``).

The subset: ``&&``, ``||``, ``!``, unary ``-``, ``< <= > >= == !=``, ``+ - *``, ``/`` on doubles,
parentheses; literals ``true``, ``false``, integers, doubles, strings without escapes or prefixes;
``root.field``, ``root["key"]``, ``x.member``, ``x["member"]``; ``cost("<target>")``. CEL semantics
kept: ``&&``/``||`` evaluate the left side first and stop at ``false``/``true`` (CEL would too: a
``false && <error>`` is false, and when the left side is an error the closure defers to CEL);
comparisons across int and double compare numerically (CEL's heterogeneous comparison), equality
across other types and arithmetic across int and double are left to CEL.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from pointsman.policy.rules.cel_refs import Token, _string_value, tokenize

#: What a condition returns when CEL must decide (see the module).
DEFER = object()
#: A compiled condition: (CEL variables, cost function) -> True, False or ``DEFER``.
Condition: TypeAlias = Callable[[Mapping[str, object], Callable[[str], float]], object]
_Node: TypeAlias = Callable[[Mapping[str, object], Callable[[str], float]], object]

_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
#: Integers beyond this may compare differently against a double when converted (2**53).
_EXACT_INT = 1 << 53


class _Defer(Exception):
    """Inside a closure: CEL decides (see the module)."""


class _Unsupported(Exception):
    """At compile time: the expression uses something outside the subset."""


def _is_num(t: type) -> bool:
    return t is int or t is float


def _compare(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def compare(a: Any, b: Any) -> bool:
        ta, tb = type(a), type(b)
        if ta is tb and ta is not float:
            if ta is int:
                if not _I64_MIN <= a <= _I64_MAX or not _I64_MIN <= b <= _I64_MAX:
                    raise _Defer
                return op(a, b)
            if ta is str or ta is bool:
                return op(a, b)
            raise _Defer
        if _is_num(ta) and _is_num(tb):
            if a != a or b != b:  # NaN: CEL has no ordering for it  # noqa: PLR0124
                raise _Defer
            if (ta is int and not -_EXACT_INT <= a <= _EXACT_INT) or \
                    (tb is int and not -_EXACT_INT <= b <= _EXACT_INT):
                raise _Defer
            return op(a, b)
        raise _Defer
    return compare


def _equal(negate: bool) -> Callable[[Any, Any], bool]:
    def equal(a: Any, b: Any) -> bool:
        ta, tb = type(a), type(b)
        if ta is tb and (ta is str or ta is bool or ta is float):
            return bool(a != b) if negate else bool(a == b)
        if _is_num(ta) and _is_num(tb):
            if (ta is int and not -_EXACT_INT <= a <= _EXACT_INT) or \
                    (tb is int and not -_EXACT_INT <= b <= _EXACT_INT):
                raise _Defer
            return bool(a != b) if negate else bool(a == b)
        raise _Defer
    return equal


def _arith(op: Callable[[Any, Any], Any], name: str) -> Callable[[Any, Any], Any]:
    def arith(a: Any, b: Any) -> Any:
        ta, tb = type(a), type(b)
        if ta is float and tb is float:
            if name == "/" and b == 0.0:
                raise _Defer
            return op(a, b)
        if ta is int and tb is int and name != "/":
            if not _I64_MIN <= a <= _I64_MAX or not _I64_MIN <= b <= _I64_MAX:
                raise _Defer
            out = op(a, b)
            if not _I64_MIN <= out <= _I64_MAX:
                raise _Defer
            return out
        raise _Defer
    return arith


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "<": _compare(operator.lt), "<=": _compare(operator.le), ">": _compare(operator.gt), ">=": _compare(operator.ge),
    "==": _equal(False), "!=": _equal(True),
    "+": _arith(operator.add, "+"), "-": _arith(operator.sub, "-"), "*": _arith(operator.mul, "*"),
    "/": _arith(operator.truediv, "/"),
}
_RELATIONS = ("<", "<=", ">", ">=", "==", "!=")


class _Parser:
    """A recursive-descent parser of the subset (CEL's precedence: ``||`` < ``&&`` < relations <
    ``+ -`` < ``* /`` < unary < member access), building closures."""

    def __init__(self, tokens: list[Token]) -> None:
        self.toks = tokens
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i].text if self.i < len(self.toks) else None

    def take(self, text: str | None = None) -> Token:
        if self.i >= len(self.toks) or (text is not None and self.toks[self.i].text != text):
            raise _Unsupported
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expression(self) -> _Node:
        node = self.or_()
        if self.peek() == "?":
            raise _Unsupported
        return node

    def or_(self) -> _Node:
        left = self.and_()
        while self.peek() == "||":
            self.take()
            left = _junction(True, left, self.and_())
        return left

    def and_(self) -> _Node:
        left = self.relation()
        while self.peek() == "&&":
            self.take()
            left = _junction(False, left, self.relation())
        return left

    def relation(self) -> _Node:
        left = self.additive()
        while self.peek() in _RELATIONS:
            left = _binary(_BINARY[self.take().text], left, self.additive())
        if self.peek() == "in":
            raise _Unsupported
        return left

    def additive(self) -> _Node:
        left = self.multiplicative()
        while self.peek() in ("+", "-"):
            left = _binary(_BINARY[self.take().text], left, self.multiplicative())
        return left

    def multiplicative(self) -> _Node:
        left = self.unary()
        while self.peek() in ("*", "/", "%"):
            op = self.take().text
            if op == "%":
                raise _Unsupported
            left = _binary(_BINARY[op], left, self.unary())
        return left

    def unary(self) -> _Node:
        if self.peek() == "!":
            self.take()
            return _not(self.unary())
        if self.peek() == "-":
            self.take()
            return _neg(self.unary())
        return self.member()

    def member(self) -> _Node:
        node = self.primary()
        while self.peek() in (".", "["):
            if self.take().text == ".":
                name = self.take()
                if name.kind != "ident" or self.peek() == "(":
                    raise _Unsupported
                node = _select(node, name.text)
            else:
                key = self.take()
                value = _string_value(key.text) if key.kind == "str" and key.text[0] in "'\"" else None
                if value is None or "\\" in key.text:
                    raise _Unsupported
                self.take("]")
                node = _select(node, value)
        return node

    def primary(self) -> _Node:
        tok = self.take()
        if tok.text == "(":
            node = self.or_()
            self.take(")")
            return node
        if tok.kind == "num":
            return _const(_number(tok.text))
        if tok.kind == "str":
            if tok.text[0] not in "'\"" or "\\" in tok.text or tok.text[:3] in ("'''", '"""'):
                raise _Unsupported
            value = _string_value(tok.text)
            if value is None:
                raise _Unsupported
            return _const(value)
        if tok.kind != "ident" or tok.text in ("null", "in"):
            raise _Unsupported
        if tok.text in ("true", "false"):
            return _const(tok.text == "true")
        if self.peek() == "(":
            self.take()
            arg = self.take()
            self.take(")")
            target = _string_value(arg.text) if arg.kind == "str" and arg.text[0] in "'\"" else None
            if tok.text != "cost" or target is None or "\\" in arg.text:
                raise _Unsupported
            return _cost(target)
        return _root(tok.text)


def _number(text: str) -> int | float:
    lower = text.lower()
    if lower.endswith("u") or lower.startswith("0x"):
        raise _Unsupported
    if any(c in lower for c in ".e"):
        return float(text)
    value = int(text)
    if value > _I64_MAX:
        raise _Unsupported
    return value


def _const(value: object) -> _Node:
    def const(v: Mapping[str, object], cost: Callable[[str], float]) -> object:
        return value
    return const


def _root(name: str) -> _Node:
    def root(v: Mapping[str, object], cost: Callable[[str], float]) -> object:
        try:
            return v[name]
        except KeyError:
            raise _Defer from None
    return root


def _select(node: _Node, key: str) -> _Node:
    def select(v: Mapping[str, object], cost: Callable[[str], float]) -> object:
        ns = node(v, cost)
        if type(ns) is not dict or key not in ns:
            raise _Defer
        return ns[key]
    return select


def _cost(target: str) -> _Node:
    def call(v: Mapping[str, object], cost: Callable[[str], float]) -> object:
        try:
            value = cost(target)
        except Exception:  # noqa: BLE001 - CEL reports the failure (its own message)
            raise _Defer from None
        if type(value) is not float:
            raise _Defer
        return value
    return call


def _binary(op: Callable[[Any, Any], Any], left: _Node, right: _Node) -> _Node:
    def binary(v: Mapping[str, object], cost: Callable[[str], float]) -> object:
        return op(left(v, cost), right(v, cost))
    return binary


def _junction(shortcut: bool, left: _Node, right: _Node) -> _Node:
    """``&&`` (``shortcut`` False: a false left side decides) or ``||`` (True): booleans only, as
    CEL on booleans; anything else defers to CEL (which also knows its error-absorbing rules)."""
    def junction(v: Mapping[str, object], cost: Callable[[str], float]) -> object:
        a = left(v, cost)
        if a is shortcut:
            return shortcut
        if a is not (not shortcut):
            raise _Defer
        b = right(v, cost)
        if type(b) is not bool:
            raise _Defer
        return b
    return junction


def _not(node: _Node) -> _Node:
    def not_(v: Mapping[str, object], cost: Callable[[str], float]) -> object:
        a = node(v, cost)
        if type(a) is not bool:
            raise _Defer
        return not a
    return not_


def _neg(node: _Node) -> _Node:
    def neg(v: Mapping[str, object], cost: Callable[[str], float]) -> object:
        a = node(v, cost)
        if type(a) is float:
            return -a
        if type(a) is int and a != _I64_MIN:
            return -a
        raise _Defer
    return neg


def closure(source: str) -> Condition | None:
    """The closure of CEL expression ``source``, or None when it uses anything outside the subset
    (see the module). The expression must already compile in CEL."""
    toks = tokenize(source)
    if not toks or any(t.kind == "other" for t in toks):
        return None
    parser = _Parser(toks)
    try:
        node = parser.expression()
    except (_Unsupported, ValueError):
        return None
    if parser.i != len(toks):
        return None

    def condition(v: Mapping[str, object], cost: Callable[[str], float]) -> object:
        try:
            out = node(v, cost)
        except _Defer:
            return DEFER
        return out if type(out) is bool else DEFER
    return condition


__all__ = ["DEFER", "Condition", "closure"]
