"""JSON wire form shared by the versioned codecs (writer results, committables).

Values that JSON cannot carry (bytes, Decimal, datetime-free Iceberg partition values are plain
ints/strings) are tagged as one-key objects so they round-trip exactly.
"""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from typing import Any

from iceberg_sink.errors import IcebergSinkError


class CodecError(IcebergSinkError, ValueError):
    """A serialized value is malformed or of a version this code cannot read. Fatal."""


def encode_value(value: Any) -> Any:
    """Encode one scalar (partition value or metric) to a JSON-safe form."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"f": repr(value)}
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return {"b": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Decimal):
        return {"d": str(value)}
    raise CodecError(f"cannot encode value of type {type(value).__name__}: {value!r}")


def decode_value(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) != 1:
            raise CodecError(f"expected a one-key tagged value, received {value!r}")
        ((tag, payload),) = value.items()
        if tag == "b":
            return base64.b64decode(payload)
        if tag == "d":
            return Decimal(payload)
        if tag == "f":
            return float(payload)
        raise CodecError(f"unknown value tag {tag!r}")
    return value


def dumps(kind: str, version: int, body: dict[str, Any]) -> bytes:
    return json.dumps({"kind": kind, "version": version, **body}, separators=(",", ":"), sort_keys=True).encode()


def loads(data: bytes, kind: str, versions: tuple[int, ...]) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise CodecError(f"expected a JSON {kind}, received undecodable bytes ({e})") from None
    if not isinstance(obj, dict) or obj.get("kind") != kind:
        raise CodecError(f"expected a serialized {kind}, received {str(obj)[:200]!r}")
    if obj.get("version") not in versions:
        raise CodecError(
            f"{kind} has version {obj.get('version')!r}; this iceberg_sink reads versions {versions}. "
            "Upgrade iceberg_sink to read it."
        )
    return obj
