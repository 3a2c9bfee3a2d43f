"""JSON in and out of model manifests: typed blocks become JSON objects, JSON read back
becomes typed values, each checked at run time.

- ``to_json_value(value)`` / ``to_json_object(mapping)``: a ``TypedDict`` block (or any
  mapping, list, tuple, scalar) as ``pointsman.json_types`` data, for ``Manifest`` fields;
  raises ``TypeError`` for what ``json.dumps`` would refuse too;
- ``as_number(value, what)``; ``json_number(obj, key, default)``, ``json_text(obj, key)``,
  ``json_object_at(obj, key)``: a JSON value, or one field of a JSON object (a manifest's
  ``training`` block, build details), as a float, a string or an object; a value of the wrong
  kind raises ``ValueError`` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping

from pointsman.json_types import JSONObject, JSONValue


def to_json_value(value: object) -> JSONValue:
    """``value`` as JSON data: mappings with string keys and lists or tuples converted all the
    way down, scalars as they are (``json.dumps`` writes both alike). Raises ``TypeError`` for
    anything else."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, Mapping):
        return to_json_object(value)
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    raise TypeError(f"not JSON data: {type(value).__name__}")


def to_json_object(mapping: Mapping[str, object]) -> JSONObject:
    """``mapping`` as a JSON object (see ``to_json_value``). Raises ``TypeError`` for a key that
    is not a string or a value that is not JSON data."""
    out: JSONObject = {}
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise TypeError(f"not a JSON object key: {key!r}")
        out[key] = to_json_value(value)
    return out


def as_number(value: JSONValue, what: str) -> float:
    """``value`` as a number; ``what`` names it in the error."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what}: expected a number, got {value!r}")
    return value


def json_number(obj: JSONObject, key: str, default: float | None = None) -> float:
    """``obj[key]`` as a number (``default`` when absent or null and a default is given)."""
    value = obj.get(key)
    if value is None and default is not None:
        return default
    return as_number(value, key)


def json_text(obj: JSONObject, key: str) -> str:
    """``obj[key]`` as a string."""
    value = obj.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a string, got {value!r}")
    return value


def json_object_at(obj: JSONObject, key: str) -> JSONObject:
    """``obj[key]`` as an object ({} when absent, null or empty)."""
    value = obj.get(key)
    if not value:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{key}: expected an object, got {value!r}")
    return value


__all__ = ["as_number", "json_number", "json_object_at", "json_text", "to_json_object", "to_json_value"]
