"""Located configuration files: YAML parsed with PyYAML's node marks, validated
with pydantic, every problem reported at once as ``file:line:col: code: message``.

``load_config(path, model, error_cls) -> (model instance, LocatedDocument)`` reads a
YAML file, validates it into a pydantic model whose classes forbid unknown keys,
and raises ``error_cls(problems)`` (a ``ConfigError`` subclass) listing every
problem: YAML syntax, undecodable bytes, duplicate keys, unknown keys (with
"did you mean", from ``difflib``), missing keys and invalid values.

``LocatedDocument`` maps a path into the data (a pydantic error location such as
``("targets", "onprem-8b", "pools", "aggregated", "endpoints", 0)``) back to the
line and column of the YAML node, and an offset inside a scalar string (a CEL
expression) to its line and column in the file, for block, folded and quoted
scalars alike. Lines and columns are 1-based.

Size limits (``too-large``): ``parse_yaml(..., max_bytes=, max_nodes=)`` rejects text over
``max_bytes`` before parsing, and counts YAML nodes while composing them, each alias
weighted by the size of the node it repeats (what the located walkers and pydantic see
once aliases are expanded), stopping at the first node past ``max_nodes``; so an alias
bomb ("billion laughs") is rejected without being expanded. An alias inside the node it
refers to (``&a [*a]``) expands without end and is always rejected.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias, TypeGuard, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from pointsman.errors import ConfigError, Problem

#: A path into the data: mapping keys and list indexes, as pydantic's error locations give them.
Loc: TypeAlias = tuple[int | str, ...]

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base of every config model: unknown keys are errors, values are not coerced from strings."""

    model_config = ConfigDict(extra="forbid", strict=False, frozen=True)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices`` (difflib ratio ≥ 0.6), else ``""``."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


@dataclass
class LocatedDocument:
    """A parsed YAML document: ``data`` (plain Python: what PyYAML's safe loader builds, so
    mappings, lists, strings, numbers, booleans, None, dates...) and the node tree with marks."""

    file: str
    text: str
    data: object
    root: yaml.Node | None

    # -- paths into the node tree -------------------------------------------------
    def _walk(self, path: Loc) -> tuple[yaml.Node | None, yaml.Node | None, bool]:
        """Follow ``path`` as far as it matches: returns (value node, key node of the last step, complete).

        Items that do not match the current node (pydantic's union tags) are skipped.
        """
        node, key_node, complete = self.root, None, True
        for item in path:
            if isinstance(node, yaml.MappingNode):
                found = next(((k, v) for k, v in node.value if _scalar_equals(k, item)), None)
                if found is None:
                    if isinstance(item, str):
                        complete = False
                    continue
                key_node, node = found
            elif isinstance(node, yaml.SequenceNode) and isinstance(item, int):
                if 0 <= item < len(node.value):
                    key_node, node = None, node.value[item]
                else:
                    complete = False
            else:
                complete = False
        return node, key_node, complete

    def mark(self, path: Loc, *, key: bool = False) -> tuple[int, int]:
        """(line, col) of the node at ``path`` (its key when ``key``), or of the deepest node that exists."""
        node, key_node, _ = self._walk(path)
        target = key_node if key and key_node is not None else node
        if target is None:
            return (1, 1) if self.root is not None else (0, 0)
        return target.start_mark.line + 1, target.start_mark.column + 1

    def node(self, path: Loc) -> yaml.Node | None:
        """The node at ``path`` when the whole path exists, else None."""
        node, _, complete = self._walk(path)
        return node if complete else None

    def scalar_position(self, path: Loc, offset: int) -> tuple[int, int]:
        """(line, col) in the file of character ``offset`` of the scalar string at ``path``.

        Aligns the parsed value with the raw source between the node's marks, so
        quoted, plain multi-line, literal (``|``) and folded (``>``) scalars all map
        correctly (escape sequences map to the character they produce).
        """
        node = self.node(path)
        if not isinstance(node, yaml.ScalarNode):
            return self.mark(path)
        value, raw_start, raw_end = node.value, node.start_mark.index, node.end_mark.index
        raw = self.text
        pos = raw_start
        if node.style in ("|", ">"):  # skip the header line ("|-", ">+2", ...)
            nl = raw.find("\n", raw_start, raw_end)
            pos = nl + 1 if nl >= 0 else raw_end
        elif node.style in ("'", '"'):
            pos = raw_start + 1
        offset = max(0, min(offset, len(value)))
        for ch in value[:offset]:
            if ch.isspace():
                while pos < raw_end and raw[pos].isspace() and raw[pos] != ch:
                    pos += 1
                if pos < raw_end and raw[pos] == ch:
                    pos += 1
            else:
                found = raw.find(ch, pos, raw_end)
                pos = found + 1 if found >= 0 else pos
        # The target character itself: skip indentation / line breaks that precede it.
        if offset < len(value) and not value[offset].isspace():
            found = raw.find(value[offset], pos, raw_end)
            pos = found if found >= 0 else pos
        return _line_col(raw, min(pos, len(raw)))


def _scalar_equals(key_node: yaml.Node, item: int | str) -> bool:
    return isinstance(key_node, yaml.ScalarNode) and key_node.value == str(item)


def _line_col(text: str, index: int) -> tuple[int, int]:
    """1-based (line, col) of ``index`` in ``text``."""
    line = text.count("\n", 0, index) + 1
    col = index - (text.rfind("\n", 0, index) + 1) + 1
    return line, col


def _duplicate_keys(file: str, node: yaml.Node | None) -> list[Problem]:
    """Problems for mapping keys that appear twice (PyYAML silently keeps the last)."""
    problems: list[Problem] = []
    stack = [node] if node is not None else []
    while stack:
        n = stack.pop()
        if isinstance(n, yaml.MappingNode):
            seen: dict[str, yaml.Node] = {}
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode):
                    if k.value in seen:
                        first = seen[k.value].start_mark
                        problems.append(Problem(file, k.start_mark.line + 1, k.start_mark.column + 1, "duplicate-key",
                                                f"key '{k.value}' is already defined at line {first.line + 1}"))
                    else:
                        seen[k.value] = k
                stack.append(v)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
    return problems


#: PyYAML's mark types: the pure-Python one and the C extension's (``yaml._yaml``).
_Mark: TypeAlias = "yaml.error.Mark | yaml._yaml.Mark"


def _position(mark: _Mark | None) -> tuple[int, int]:
    """1-based (line, col) of a PyYAML mark (0-based), or ``(0, 0)`` without one."""
    return (mark.line + 1, mark.column + 1) if mark else (0, 0)


class _TooLarge(Exception):
    """Raised inside the loader when the document passes a size limit, at ``position`` (1-based
    line and column; ``(0, 0)`` when PyYAML gave no mark)."""

    def __init__(self, mark: _Mark | None, message: str) -> None:
        super().__init__(message)
        self.position, self.message = _position(mark), message


class _CountingLoader(yaml.SafeLoader):
    """A ``SafeLoader`` that counts nodes as it composes them, an alias counting as the whole
    node it repeats (``expanded`` = nodes of the document with every alias expanded), and
    raises ``_TooLarge`` at the first node or alias past ``max_nodes`` (None: no cap), or at an
    alias used inside the node it names. It reads ``1e-3`` and ``2.5E4`` as floats, as YAML 1.2
    does and ``pointsman calibrate``'s writer (ruamel) writes them; YAML 1.1 read them as strings,
    so a threshold written that way failed as a CEL type error on the rule that used it."""

    def __init__(self, text: str, max_nodes: int | None) -> None:
        super().__init__(text)
        self.max_nodes = max_nodes
        self.expanded = 0
        self._anchor_weights: dict[str, int] = {}

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        """PyYAML's hook, counting the node (or the alias's weight) before composing it."""
        # compose_node is only called at a node's event (alias, scalar, sequence or mapping start)
        event: yaml.NodeEvent = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in types-PyYAML
        if isinstance(event, yaml.AliasEvent):
            anchor = event.anchor
            if anchor is not None and anchor in self.anchors:  # an undefined alias is PyYAML's error
                weight = self._anchor_weights.get(anchor)
                if weight is None:
                    raise _TooLarge(event.start_mark, f"alias *{anchor} is used inside the node it names, "
                                    "so it expands without end")
                self._count(weight, event.start_mark, f"alias *{anchor} (a node of {weight:,} nodes)")
            return super().compose_node(parent, index)  # type: ignore[arg-type]  # types-PyYAML says int; PyYAML passes nodes too
        before = self.expanded
        self._count(1, event.start_mark, "this node")
        node = super().compose_node(parent, index)  # type: ignore[arg-type]  # as above
        if event.anchor is not None:
            self._anchor_weights[event.anchor] = self.expanded - before
        return node

    def _count(self, weight: int, mark: _Mark | None, what: str) -> None:
        self.expanded += weight
        if self.max_nodes is not None and self.expanded > self.max_nodes:
            raise _TooLarge(mark, f"the document passes {self.max_nodes:,} YAML nodes at {what} (an alias counts "
                            "as the nodes it repeats, at every use)")


_CountingLoader.add_implicit_resolver(  # YAML 1.2's exponent floats without a dot (see the class)
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def parse_yaml(text: str, file: str, error_cls: type[ConfigError], *, max_bytes: int | None = None,
               max_nodes: int | None = None) -> LocatedDocument:
    """Parse one YAML document with marks; raises ``error_cls`` on syntax errors or duplicate keys,
    and with code ``too-large`` when ``text`` is over ``max_bytes`` UTF-8 bytes (located at the
    first byte past it), its nodes with aliases expanded are more than ``max_nodes`` (located
    at the node or alias that passes it; see the module), or an alias is recursive."""
    if max_bytes is not None and len(text) > max_bytes // 4:  # below that, no UTF-8 text can be over
        raw = text.encode("utf-8")
        if len(raw) > max_bytes:
            raise error_cls([_too_many_bytes(file, raw, len(raw), max_bytes)])
    try:
        loader = _CountingLoader(text, max_nodes)
    except yaml.reader.ReaderError as exc:  # a control character: rejected before parsing starts
        line, col = _line_col(text, exc.position)
        raise error_cls([Problem(file, line, col, "yaml-syntax", f"character #x{exc.character:04x} is not allowed "
                                 "in YAML (special characters)")]) from None
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        line, col = _position(exc.problem_mark or exc.context_mark)
        message = " ".join(str(s) for s in (exc.context, exc.problem) if s) or "invalid YAML"
        raise error_cls([Problem(file, line, col, "yaml-syntax", message)]) from None
    except yaml.YAMLError as exc:
        raise error_cls([Problem(file, 0, 0, "yaml-syntax", str(exc))]) from None
    except _TooLarge as exc:
        raise error_cls([Problem(file, *exc.position, "too-large", exc.message)]) from None
    finally:
        loader.dispose()
    problems = _duplicate_keys(file, root)
    if problems:
        raise error_cls(sorted(problems, key=lambda p: (p.line, p.col)))
    return LocatedDocument(file=file, text=text, data=data, root=root)


def _too_many_bytes(file: str, raw: bytes, size: int, max_bytes: int) -> Problem:
    """A ``too-large`` problem located at the first byte past ``max_bytes`` of ``raw``."""
    before = raw[:max_bytes].decode("utf-8", "replace")
    line, col = _line_col(before, len(before))
    return Problem(file, line, col, "too-large", f"{size:,} bytes; the limit is {max_bytes:,} bytes "
                   "and the text passes it here")


def read_text(path: str | Path, error_cls: type[ConfigError], *, max_bytes: int | None = None) -> str:
    """Read a UTF-8 file; raises ``error_cls`` with a located problem if missing or undecodable, or
    (code ``too-large``) longer than ``max_bytes`` bytes (only ``max_bytes + 1`` bytes are read)."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read() if max_bytes is None else f.read(max_bytes + 1)
        if max_bytes is not None and len(raw) > max_bytes:
            raise error_cls([_too_many_bytes(str(path), raw, max(p.stat().st_size, len(raw)), max_bytes)])
    except FileNotFoundError:
        raise error_cls([Problem(str(path), 0, 0, "file-not-found", "no such file")]) from None
    except IsADirectoryError:
        raise error_cls([Problem(str(path), 0, 0, "file-not-found", "is a directory, not a file")]) from None
    except OSError as exc:
        raise error_cls([Problem(str(path), 0, 0, "file-unreadable", exc.strerror or str(exc))]) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = raw[: exc.start].decode("utf-8", "replace")
        line, col = _line_col(before, len(before))
        raise error_cls([Problem(str(path), line, col, "encoding", f"not valid UTF-8 (byte 0x{raw[exc.start]:02x})")]) from None


# -- pydantic errors -> located problems ---------------------------------------------


def _allowed_keys(model: type[BaseModel], loc: Loc) -> list[str]:
    """Field names of the pydantic model found at ``loc`` (a walk through annotations)."""
    current: object = model
    for item in loc:
        current = _descend(current, item)
        if current is None:
            return []
    return list(current.model_fields) if _is_model(current) else []


def _is_model(tp: object) -> TypeGuard[type[BaseModel]]:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _union_members(tp: object) -> list[object]:
    """The members of a union annotation (``Annotated`` unwrapped, nested unions flattened);
    ``[tp]`` for any other annotation."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _union_members(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        out: list[object] = []
        for a in typing.get_args(tp):
            out.extend(_union_members(a))
        return out
    return [tp]


def _descend(tp: object, item: int | str) -> object:
    """The annotation reached from ``tp`` by one location item (field name, index, key or union
    tag), or None."""
    members = _union_members(tp)
    for m in members:
        if _is_model(m):
            if isinstance(item, str) and item in m.model_fields:
                return m.model_fields[item].annotation
            # a union tag (discriminator value) selects this member
            for f in m.model_fields.values():
                if typing.get_origin(f.annotation) is typing.Literal and item in typing.get_args(f.annotation):
                    return m
        origin = typing.get_origin(m)
        args = typing.get_args(m)
        if origin in (list, tuple) and isinstance(item, int) and args:
            return args[0]
        if origin is dict and args:
            return args[1]
    return None


_CODES = {"extra_forbidden": "unknown-key", "missing": "missing-key"}


def validation_problems(exc: ValidationError, doc: LocatedDocument, model: type[BaseModel]) -> list[Problem]:
    """Translate a pydantic ``ValidationError`` into located problems (one per error)."""
    problems = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        kind = err["type"]
        code = _CODES.get(kind, "invalid-value")
        path = _dotted(loc, doc)
        if kind == "extra_forbidden":
            key = loc[-1]
            line, col = doc.mark(loc, key=True)
            where = _dotted(loc[:-1], doc)
            msg = f"unknown key '{key}'" + (f" in {where}" if where else "")
            msg += did_you_mean(str(key), _allowed_keys(model, loc[:-1]))
        elif kind == "missing":
            line, col = doc.mark(loc[:-1])
            where = _dotted(loc[:-1], doc)
            msg = f"missing required key '{loc[-1]}'" + (f" in {where}" if where else "")
        else:
            line, col = doc.mark(loc)
            msg = (f"{path}: " if path else "") + err["msg"].removeprefix("Value error, ")
        problems.append(Problem(doc.file, line, col, code, msg))
    return problems


def _dotted(loc: Loc, doc: LocatedDocument) -> str:
    """``targets.onprem-8b.pools[0]``, leaving out items absent from the data (union tags)."""
    out, node = "", doc.root
    for item in loc:
        if isinstance(node, yaml.MappingNode):
            found = next((v for k, v in node.value if _scalar_equals(k, item)), None)
            if found is None:
                continue
            node = found
        elif isinstance(node, yaml.SequenceNode) and isinstance(item, int):
            node = node.value[item] if 0 <= item < len(node.value) else None
        out += f"[{item}]" if isinstance(item, int) else ("." if out else "") + str(item)
    return out


def validate(doc: LocatedDocument, model: type[M], error_cls: type[ConfigError]) -> M:
    """Validate ``doc.data`` into ``model``; raises ``error_cls`` listing every problem, located."""
    if not isinstance(doc.data, dict):
        got = "an empty file" if doc.data is None else type(doc.data).__name__
        raise error_cls([Problem(doc.file, 1, 1, "invalid-value", f"expected a mapping at the top level, got {got}")])
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        raise error_cls(sorted(validation_problems(exc, doc, model), key=lambda p: (p.line, p.col))) from None


def load_config(path: str | Path, model: type[M], error_cls: type[ConfigError]) -> tuple[M, LocatedDocument]:
    """Read, parse and validate a YAML config file; raises ``error_cls`` listing every problem."""
    text = read_text(path, error_cls)
    doc = parse_yaml(text, str(path), error_cls)
    return validate(doc, model, error_cls), doc
