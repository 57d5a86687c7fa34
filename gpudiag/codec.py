"""JSON for the versioned dataclasses of ``gpudiag.diagnosis``: encode, decode, upgrade.

Dataclasses to plain JSON values and back by their type hints, so a Diagnosis round-trips
exactly; ``upgrade`` brings an older schema's dict into the current shape before decoding
(readers refuse versions they do not know before calling it).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from typing import Any

from gpudiag.errors import BadInput


class JsonValue:
    """``to_dict`` / ``to_json`` for a dataclass that round-trips through ``decode``."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = encode(self)
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


def load_versioned(cls: Any, data: Any, readable: tuple[int, ...]) -> Any:
    """``cls`` from a dict of one of the ``readable`` schema versions (older ones upgraded
    first); anything else is a ``BadInput`` saying what this gpudiag reads."""
    if not isinstance(data, dict):
        raise BadInput("diagnosis must be a JSON object")
    version = data.get("schema_version")
    if version not in readable:
        raise BadInput(
            f"diagnosis schema version {version!r} is not supported (this gpudiag reads "
            f"versions {', '.join(map(str, readable))}); re-run gpudiag analyze")
    try:
        return decode(cls, upgrade(data))
    except (TypeError, ValueError, KeyError) as e:
        raise BadInput(f"diagnosis is malformed: {e}") from None


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A version 1 or 2 diagnosis in version 3's shape: recommendations were plain strings."""
    if data.get("schema_version", 3) >= 3:
        return data
    data = dict(data)
    for key in ("verdict", "traced_verdict"):
        v = data.get(key)
        if isinstance(v, dict) and isinstance(v.get("recommendations"), list):
            v = dict(v)
            v["recommendations"] = [
                {"action": "unknown", "text": r, "predicted_step_s": None,
                 "why": f"written by a gpudiag of diagnosis schema {data.get('schema_version')}, "
                        "before predictions"} if isinstance(r, str) else r
                for r in v["recommendations"]]
            data[key] = v
    return data


def encode(v: Any) -> Any:
    if dataclasses.is_dataclass(v):
        return {f.name: encode(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, dict):
        return {str(k): encode(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [encode(x) for x in v]
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return None
        return v
    return v


def decode(tp: Any, v: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if v is None:
            return None
        return decode(args[0], v)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in v:
                kwargs[f.name] = decode(hints[f.name], v[f.name])
        return tp(**kwargs)  # type: ignore[operator]  # a dataclass type (is_dataclass narrows to instances too)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(v)
    if origin is list:
        (inner,) = typing.get_args(tp)
        return [decode(inner, x) for x in v]
    if origin is dict:
        _, inner = typing.get_args(tp)
        return {k: decode(inner, x) for k, x in v.items()}
    if tp is float:
        return float("nan") if v is None else float(v)
    return v
