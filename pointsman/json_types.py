"""JSON-shaped values, for the places that carry parsed or to-be-serialized JSON (decision
traces, request bodies, report files). Recursive aliases (``TypeAliasType``, so pydantic
validates them and mypy checks them all the way down).

- ``JSONScalar``: ``str | int | float | bool | None``;
- ``JSONValue``: a scalar, a list of values or an object;
- ``JSONObject``: ``dict[str, JSONValue]`` (what ``json.loads`` gives for an object);
- ``JSONBool``: a boolean field of a request body that takes JSON ``true``/``false`` only
  (pydantic's lax ``bool`` would read ``"yes"``, ``"on"``, ``1`` and ``"0"`` as booleans).

``json_path(loc, prefix="")`` names a place inside a JSON document the way error messages
do (``[2].load.num_requests_waiting``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Union

from pydantic import Strict
from typing_extensions import TypeAliasType

JSONScalar = TypeAliasType("JSONScalar", Union[str, int, float, bool, None])  # noqa: UP007 - evaluated at runtime
JSONValue = TypeAliasType("JSONValue", Union[JSONScalar, "list[JSONValue]", "dict[str, JSONValue]"])  # noqa: UP007
JSONObject = TypeAliasType("JSONObject", "dict[str, JSONValue]")
JSONBool = Annotated[bool, Strict()]


def json_path(loc: Iterable[int | str], prefix: str = "") -> str:
    """The place ``loc`` (object keys and list indexes, outermost first: a pydantic error
    location) as error messages name it: ``[2].load.num_requests_waiting``, indexes in brackets
    and keys after dots; ``prefix`` (e.g. ``[2]``, the item's index in a batch) comes first."""
    out = prefix
    for item in loc:
        out += f"[{item}]" if isinstance(item, int) else ("." if out else "") + str(item)
    return out
