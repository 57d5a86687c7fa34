"""FLOPs and bytes moved by one operator, from the shapes the profiler recorded.

Only ``Input Dims`` / ``Input type`` are recorded, never outputs, so output sizes are
derived from each operator's semantics. Matmul, convolution and attention FLOPs are exact
(2 FLOPs per multiply-accumulate, the convention MFU papers use); elementwise, norm and
reduction costs are estimates whose purpose is the roofline's memory side, where bytes
dominate. Any operator not listed here gets no cost: the analysis then says so rather than
guessing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpudiag.devices import DTYPE_BYTES


@dataclass(frozen=True)
class OpCost:
    flops: float
    bytes: float
    dtype: str
    model_flop: bool  # counts toward model FLOPs (MFU): matmul, conv, attention


_MM = {"aten::mm", "aten::matmul", "aten::bmm", "aten::linear"}
_ADDMM = {"aten::addmm", "aten::baddbmm", "aten::addbmm"}
_CONV = {
    "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution",
    "aten::cudnn_convolution", "aten::mkldnn_convolution", "aten::_conv_depthwise2d",
    "aten::miopen_convolution", "aten::_slow_conv2d_forward", "aten::thnn_conv2d",
}
_CONV_BWD = {"aten::convolution_backward", "aten::cudnn_convolution_backward"}
_SDPA = {
    "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
    "aten::_flash_attention_forward", "aten::_efficient_attention_forward",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
}
_SDPA_BWD = {
    "aten::_scaled_dot_product_flash_attention_backward",
    "aten::_scaled_dot_product_efficient_attention_backward",
    "aten::_flash_attention_backward", "aten::_efficient_attention_backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
}
# Elementwise-like operators: FLOPs per output element (estimate), output = broadcast of
# inputs. Norms and softmax do a handful of FLOPs per element.
_ELEMENTWISE: dict[str, float] = {
    **{f"aten::{n}": 1.0 for n in (
        "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "relu", "relu_", "gelu",
        "silu", "silu_", "sigmoid", "tanh", "exp", "neg", "sqrt", "rsqrt", "pow", "abs",
        "threshold_backward", "gelu_backward", "silu_backward", "sigmoid_backward",
        "tanh_backward", "addcmul_", "addcdiv_", "lerp_", "clamp", "clamp_", "where",
        "copy_", "clone", "_to_copy", "fill_", "zero_", "masked_fill_", "native_dropout",
        "dropout", "hardtanh", "hardtanh_", "leaky_relu", "mse_loss", "mse_loss_backward",
        "_foreach_add_", "sum", "mean", "cumsum", "max", "min", "argmax", "maximum", "minimum",
        "eq", "ne", "gt", "lt", "ge", "le", "embedding", "embedding_dense_backward",
        "index_select", "gather", "scatter_add_", "max_pool2d_with_indices", "avg_pool2d",
        "adaptive_avg_pool2d", "max_pool2d_with_indices_backward", "adaptive_avg_pool2d_backward",
    )},
    **{f"aten::{n}": 5.0 for n in (
        "softmax", "_softmax", "log_softmax", "_log_softmax", "_softmax_backward_data",
        "_log_softmax_backward_data", "layer_norm", "native_layer_norm",
        "native_layer_norm_backward", "batch_norm", "native_batch_norm", "_batch_norm_impl_index",
        "cudnn_batch_norm", "native_batch_norm_backward", "cudnn_batch_norm_backward",
        "group_norm", "native_group_norm", "rms_norm", "_fused_rms_norm", "nll_loss_forward",
        "cross_entropy_loss",
    )},
}


def _dims(d: Any) -> list[int] | None:
    """A tensor's shape, or None for scalars, lists of tensors and anything malformed."""
    if not isinstance(d, list) or not d:
        return None
    if all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d):
        return d
    return None


def _numel(d: list[int]) -> int:
    return math.prod(d)


def _dtype(types: Any, i: int) -> str:
    if isinstance(types, list) and i < len(types) and isinstance(types[i], str):
        return types[i].lower()
    return "float"


def _size(dtype: str) -> int:
    return DTYPE_BYTES.get(dtype, 4)


def _matmul_flops(a: list[int], b: list[int]) -> tuple[float, list[int]] | None:
    """FLOPs and output shape of torch.matmul semantics (1-D promotion, batch broadcast)."""
    a2 = [1] + a if len(a) == 1 else a
    b2 = b + [1] if len(b) == 1 else b
    if len(a2) < 2 or len(b2) < 2 or a2[-1] != b2[-2]:
        return None
    m, k, n = a2[-2], a2[-1], b2[-1]
    batch_a, batch_b = a2[:-2], b2[:-2]
    nb = max(len(batch_a), len(batch_b))
    batch_a = [1] * (nb - len(batch_a)) + batch_a
    batch_b = [1] * (nb - len(batch_b)) + batch_b
    batch = [max(x, y) for x, y in zip(batch_a, batch_b, strict=False)]
    out = batch + [m, n]
    return 2.0 * math.prod(batch) * m * k * n, out


def op_cost(name: str, dims_arg: Any, types: Any, concrete: Any = None) -> OpCost | None:
    """Cost of one operator call, or None when its semantics are unknown to us."""
    if not isinstance(dims_arg, list) or not name.startswith("aten::"):
        return None
    dims = [_dims(d) for d in dims_arg]
    try:
        if name in _MM or name in _ADDMM:
            return _mm_cost(name, dims, types)
        if name in _CONV:
            return _conv_cost(dims, types, backward=False)
        if name in _CONV_BWD:
            # dims: grad_output, input, weight: grad wrt input and weight = 2x forward.
            return _conv_cost([dims[1], dims[2]] if len(dims) > 2 else [], types, backward=True,
                              grad_out=dims[0] if dims else None)
        if name in _SDPA or name in _SDPA_BWD:
            return _sdpa_cost(dims, types, backward=name in _SDPA_BWD)
        per_elem = _ELEMENTWISE.get(name)
        if per_elem is not None:
            return _elementwise_cost(dims, types, per_elem)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return None


def _mm_cost(name: str, dims: list[list[int] | None], types: Any) -> OpCost | None:
    off = 1 if name in _ADDMM else 0
    if len(dims) < off + 2:
        return None
    a, b = dims[off], dims[off + 1]
    if name == "aten::linear":
        # linear(input, weight[out, in], bias): input @ weight.T
        if a is None or b is None or len(b) != 2:
            return None
        b = [b[1], b[0]]
    if a is None or b is None:
        return None
    r = _matmul_flops(a, b)
    if r is None:
        return None
    flops, out = r
    dt = _dtype(types, off)
    nbytes = (_numel(a) + _numel(b) + _numel(out)) * _size(dt)
    if off and dims[0] is not None:
        nbytes += _numel(dims[0]) * _size(_dtype(types, 0))
    return OpCost(flops, float(nbytes), dt, True)


def _conv_cost(dims: list[list[int] | None], types: Any, backward: bool,
               grad_out: list[int] | None = None) -> OpCost | None:
    if len(dims) < 2 or dims[0] is None or dims[1] is None:
        return None
    x, w = dims[0], dims[1]
    if len(x) < 3 or len(w) != len(x):
        return None
    n, _cin = x[0], x[1]
    cout, cin_per_group = w[0], w[1]
    k = _numel(w[2:])
    if grad_out is not None and len(grad_out) == len(x):
        out_spatial = _numel(grad_out[2:])
    else:
        # Stride/padding are not in Input Dims; assume a shape-preserving convolution.
        out_spatial = _numel(x[2:])
    if cin_per_group == 0:
        return None
    macs = n * cout * out_spatial * cin_per_group * k
    flops = 2.0 * macs * (2 if backward else 1)
    dt = _dtype(types, 0)
    nbytes = (_numel(x) + _numel(w) + n * cout * out_spatial) * _size(dt)
    if backward:
        nbytes *= 2
    return OpCost(flops, float(nbytes), dt, True)


def _sdpa_cost(dims: list[list[int] | None], types: Any, backward: bool) -> OpCost | None:
    if backward:
        dims = dims[1:]  # grad_out first
    if len(dims) < 3 or any(d is None for d in dims[:3]):
        return None
    q, k, v = dims[0], dims[1], dims[2]
    if len(q) < 3 or len(k) < 3 or len(v) < 3:
        return None
    batch = _numel(q[:-2])
    lq, e = q[-2], q[-1]
    s, ev = k[-2], v[-1]
    flops = 2.0 * batch * lq * s * e + 2.0 * batch * lq * s * ev
    if backward:
        flops *= 2.5  # dQ, dK, dV and the recomputed scores (FlashAttention-2 accounting)
    dt = _dtype(types, 0 if not backward else 1)
    nbytes = (_numel(q) + _numel(k) + _numel(v) + batch * lq * ev) * _size(dt)
    return OpCost(flops, float(nbytes * (2 if backward else 1)), dt, True)


def _elementwise_cost(dims: list[list[int] | None], types: Any, per_elem: float) -> OpCost | None:
    tensors = [(i, d) for i, d in enumerate(dims) if d is not None]
    if not tensors:
        return None
    out = max(_numel(d) for _, d in tensors)
    dt = _dtype(types, tensors[0][0])
    nbytes = sum(_numel(d) * _size(_dtype(types, i)) for i, d in tensors) + out * _size(dt)
    return OpCost(per_elem * out, float(nbytes), dt, False)
