"""Static references in a CEL expression: which signals, variables and functions it names.

The CEL library (``common-expression-language``) parses and evaluates but offers no
type checker with declared variables: ``Program.variables()`` names only root
identifiers and ``Program.functions()`` only function names. Checking
``request.prompt_tokns`` against the declared signals, locating the typo, and
pruning the per-decision context to the signals a policy reads need the selection
chains too, so this module lexes the expression (CEL's lexical grammar: strings
with every prefix and quote form, numbers, identifiers, ``//`` comments) and reads
them off the token stream.

``scan(source) -> Scan``: ``refs`` (selection chains ``root.field`` or
``root["key"]`` with character offsets, and after a literal key its member,
``load["onprem-70b"].num_requests_waiting``), ``calls`` (global function calls with a
string-literal first argument when there is one, e.g. ``cost("frontier-large")``),
``bound`` (names bound by comprehension macros: ``all``, ``exists``,
``exists_one``, ``map``, ``filter``), ``dynamic_roots`` (roots used whole or with a
computed index, which pruning must keep whole).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|//[^\n]*)
  | (?P<str>(?:[rR][bB]?|[bB][rR]?)?(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"|'(?:\\.|[^\\'\n])*'|"(?:\\.|[^\\"\n])*"))
  | (?P<num>0[xX][0-9a-fA-F]+[uU]?|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[uU]?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>&&|\|\||==|!=|<=|>=|[-+*/%!<>?:.,()\[\]{}])
  | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)

MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})


@dataclass(frozen=True)
class Token:
    """One lexical token: ``kind`` (str, num, ident, punct, other), its ``text`` and character ``offset``."""

    kind: str
    text: str
    offset: int


@dataclass(frozen=True)
class Ref:
    """A selection chain: ``root`` and, when present, its first ``field`` (member or literal key).

    ``offset``/``field_offset``: character offsets of the root and of the field in the source.
    """

    root: str
    offset: int
    field: str | None = None
    field_offset: int | None = None
    keyed: bool = False
    member: str | None = None
    member_offset: int | None = None

    @property
    def path(self) -> str:
        """``root.field`` (or ``root`` alone); ``root["key"].member`` for a keyed access."""
        if self.keyed:
            head = f'{self.root}["{self.field}"]'
            return f"{head}.{self.member}" if self.member is not None else head
        return f"{self.root}.{self.field}" if self.field is not None else self.root


@dataclass(frozen=True)
class Call:
    """A global function call; ``arg``/``arg_offset``: its first argument when a plain string literal."""

    name: str
    offset: int
    arg: str | None = None
    arg_offset: int | None = None


@dataclass
class Scan:
    """What ``scan`` found in one expression."""

    refs: list[Ref] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    methods: list[Call] = field(default_factory=list)
    bound: set[str] = field(default_factory=set)
    dynamic_roots: set[str] = field(default_factory=set)


def tokenize(source: str) -> list[Token]:
    """CEL tokens of ``source`` without whitespace and comments."""
    return [Token(m.lastgroup, m.group(), m.start()) for m in _TOKEN.finditer(source)
            if m.lastgroup is not None and m.lastgroup != "ws"]


def _string_value(text: str) -> str | None:
    """The value of a CEL string literal (plain or raw); None for bytes literals."""
    prefix = text[: len(text) - len(text.lstrip("rRbB"))]
    if "b" in prefix.lower():
        return None
    body = text[len(prefix):]
    if "r" in prefix.lower():
        q = 3 if body[:3] in ("'''", '"""') else 1
        return body[q:-q]
    try:
        value = ast.literal_eval(body)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


def scan(source: str) -> Scan:
    """Find the selection chains, calls and macro-bound names of a CEL expression (see module doc)."""
    toks = tokenize(source)
    out = Scan()
    n = len(toks)

    def at(i: int, text: str) -> bool:
        return 0 <= i < n and toks[i].text == text

    for i, tok in enumerate(toks):
        if tok.kind != "ident":
            continue
        after_dot = at(i - 1, ".")
        if after_dot:
            if at(i + 1, "("):
                out.methods.append(Call(tok.text, tok.offset))
                if tok.text in MACROS and i + 3 < n and toks[i + 2].kind == "ident" and at(i + 3, ","):
                    out.bound.add(toks[i + 2].text)
            continue
        if tok.text in ("true", "false", "null", "in"):
            continue
        if at(i + 1, "("):
            call = Call(tok.text, tok.offset)
            if i + 3 < n and toks[i + 2].kind == "str" and at(i + 3, ")"):
                value = _string_value(toks[i + 2].text)
                if value is not None:
                    prefix = re.match(r"[rRbB]*", toks[i + 2].text)
                    call = Call(tok.text, tok.offset, value, toks[i + 2].offset + len(prefix.group() if prefix else "") + 1)
            out.calls.append(call)
            continue
        # A root identifier: record its first member / literal key.
        if at(i + 1, ".") and i + 2 < n and toks[i + 2].kind == "ident":
            out.refs.append(Ref(tok.text, tok.offset, toks[i + 2].text, toks[i + 2].offset))
        elif at(i + 1, "[") and i + 3 < n and toks[i + 2].kind == "str" and at(i + 3, "]"):
            key = _string_value(toks[i + 2].text)
            if key is None:
                out.dynamic_roots.add(tok.text)
                out.refs.append(Ref(tok.text, tok.offset))
            else:
                member, member_offset = None, None
                if at(i + 4, ".") and i + 5 < n and toks[i + 5].kind == "ident" and not at(i + 6, "("):
                    member, member_offset = toks[i + 5].text, toks[i + 5].offset
                elif at(i + 4, "[") and i + 6 < n and toks[i + 5].kind == "str" and at(i + 6, "]"):
                    member = _string_value(toks[i + 5].text)
                    member_offset = toks[i + 5].offset if member is not None else None
                out.refs.append(Ref(tok.text, tok.offset, key, toks[i + 2].offset, True, member, member_offset))
        else:
            out.dynamic_roots.add(tok.text)
            out.refs.append(Ref(tok.text, tok.offset))
    return out
