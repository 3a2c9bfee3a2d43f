"""JSON-shaped values, for the places that carry parsed or to-be-serialized JSON (decision
traces, request bodies, report files). Recursive aliases: mypy checks them all the way down.

- ``JSONScalar``: ``str | int | float | bool | None``;
- ``JSONValue``: a scalar, a list of values or an object;
- ``JSONObject``: ``dict[str, JSONValue]`` (what ``json.loads`` gives for an object).
"""

from __future__ import annotations

from typing import TypeAlias

JSONScalar: TypeAlias = str | int | float | bool | None
JSONValue: TypeAlias = "JSONScalar | list[JSONValue] | dict[str, JSONValue]"
JSONObject: TypeAlias = "dict[str, JSONValue]"
