"""JSON-shaped values, for the places that carry parsed or to-be-serialized JSON (decision
traces, request bodies, report files). Recursive aliases (``TypeAliasType``, so pydantic
validates them and mypy checks them all the way down).

- ``JSONScalar``: ``str | int | float | bool | None``;
- ``JSONValue``: a scalar, a list of values or an object;
- ``JSONObject``: ``dict[str, JSONValue]`` (what ``json.loads`` gives for an object).
"""

from __future__ import annotations

from typing import Union

from typing_extensions import TypeAliasType

JSONScalar = TypeAliasType("JSONScalar", Union[str, int, float, bool, None])  # noqa: UP007 - evaluated at runtime
JSONValue = TypeAliasType("JSONValue", Union[JSONScalar, "list[JSONValue]", "dict[str, JSONValue]"])  # noqa: UP007
JSONObject = TypeAliasType("JSONObject", "dict[str, JSONValue]")
