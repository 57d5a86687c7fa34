"""What an operator call costs (``OpCost``), and readers of its recorded arguments.

The profiler records, per argument position, ``Input Dims`` (a shape; a list of shapes for a
TensorList; ``[]`` for a scalar or an unrecorded list), ``Input type`` (the dtype, or
"Scalar"/"ScalarList"/"TensorList") and, since torch 2.1, ``Concrete Inputs`` (the scalar's
value as text: ``'[2, 2]'``, ``'1'``, ``'True'``, ``'0.'``, ``''`` for tensors). Every reader
here returns None for anything missing or malformed, so a cost function can refuse to guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpudiag.devices import DTYPE_BYTES

# What kind of work an op is. Nested ops of the same kind are the same work at two levels
# (linear -> addmm, conv2d -> cudnn_convolution) and the innermost one is counted; a costed op
# of another kind inside a counted op is a helper of it (addmm's bias broadcast ``copy_``,
# embedding_bag's offset arithmetic) and is absorbed into it (``roofline.innermost_costed``).
KIND_MODEL = 1  # matmul, convolution, attention: the model FLOPs of MFU
KIND_EMBEDDING = 2  # embedding lookups and bags: gathers, memory traffic
KIND_OPTIMIZER = 3  # fused and foreach optimizer steps: memory traffic over all parameters
KIND_ELEMENTWISE = 4  # elementwise, norms, reductions, indexing


@dataclass(frozen=True)
class OpCost:
    """FLOPs and bytes moved by one call. Bytes are a lower bound (each tensor read or written
    once), so an op drawn above the bandwidth roof is a counting bug, not a fast op."""

    flops: float
    bytes: float
    dtype: str
    kind: int  # KIND_*

    @property
    def model_flop(self) -> bool:
        """Counts toward model FLOPs (MFU): matmul, convolution, attention."""
        return self.kind == KIND_MODEL


# A dtype we cannot read is costed as fp32: the most common training dtype, and the one
# whose byte count (4) is the larger of the usual pair (fp32/bf16), so bytes are not
# under-estimated for fp32 work and at most 2x over for 16-bit work.
DEFAULT_DTYPE = "float"


def dims(d: Any) -> list[int] | None:
    """A tensor's shape, or None for scalars, lists of tensors and anything malformed."""
    if not isinstance(d, list) or not d:
        return None
    if all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d):
        return d
    return None


def tensor_list(d: Any) -> list[list[int]] | None:
    """Shapes of a TensorList argument (torch >= 2.13 records them; older ones write ``[]``).

    A 0-dim tensor in a list is recorded as ``[]`` and has one element.
    """
    if not isinstance(d, list) or not d or not all(isinstance(x, list) for x in d):
        return None
    out = []
    for x in d:
        if x and dims(x) is None:
            return None
        out.append(x)
    return out


def numel(d: list[int]) -> int:
    return math.prod(d)


def dtype_at(types: Any, i: int) -> str:
    if isinstance(types, list) and i < len(types) and isinstance(types[i], str) and types[i]:
        t: str = types[i].lower()
        if t not in ("scalar", "scalarlist", "tensorlist"):
            return t
    return DEFAULT_DTYPE


def size_of(dtype: str) -> int:
    return DTYPE_BYTES.get(dtype, 4)


def concrete_text(concrete: Any, i: int) -> str | None:
    if isinstance(concrete, list) and i < len(concrete) and isinstance(concrete[i], str):
        s = concrete[i].strip()
        return s or None
    return None


def concrete_ints(concrete: Any, i: int) -> list[int] | None:
    """An int list such as stride ``'[2, 2]'``, or one int ``'2'`` (as a list of one)."""
    s = concrete_text(concrete, i)
    if s is None:
        return None
    body = s[1:-1] if s.startswith("[") and s.endswith("]") else s
    try:
        return [int(x) for x in body.split(",")] if body.strip() else []
    except ValueError:
        return None


def concrete_int(concrete: Any, i: int) -> int | None:
    v = concrete_ints(concrete, i)
    s = concrete_text(concrete, i)
    return v[0] if v is not None and len(v) == 1 and s is not None and not s.startswith("[") else None


def concrete_bool(concrete: Any, i: int) -> bool | None:
    s = concrete_text(concrete, i)
    return {"True": True, "False": False, "true": True, "false": False}.get(s or "")


def concrete_bools(concrete: Any, i: int) -> list[bool] | None:
    """A bool list such as convolution_backward's output_mask ``'[True, True, False]'``."""
    s = concrete_text(concrete, i)
    if s is None or not (s.startswith("[") and s.endswith("]")):
        return None
    parts = [p.strip() for p in s[1:-1].split(",")]
    if not all(p in ("True", "False") for p in parts):
        return None
    return [p == "True" for p in parts]
