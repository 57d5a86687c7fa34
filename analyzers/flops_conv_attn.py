"""FLOPs of convolutions and attention, the two model ops whose cost needs more than shapes.

A convolution's output size depends on stride, padding and dilation, which ``Input Dims``
does not hold: they come from ``Concrete Inputs`` (torch >= 2.1). Without them a forward
convolution is left uncosted rather than guessed (the old guess, a shape-preserving
convolution, counted ResNet-50's stride-2 7x7 stem at 4x its FLOPs). Its backward needs no
such help: ``grad_output`` carries the output shape.

Attention FLOPs follow the FlashAttention convention: 4·B·H·Sq·Sk·D forward (QKᵀ and PV),
halved for a causal mask. Backward is counted as 2x forward, the model's math (dQ, dK, dV
and dP) without FlashAttention's recomputation of the scores, because MFU counts model
FLOPs (PaLM, appendix B), and a lower bound keeps every roofline point honest.
"""

from __future__ import annotations

from typing import Any

from gpudiag.analyzers.op_args import (
    KIND_MODEL,
    OpCost,
    concrete_bool,
    concrete_bools,
    concrete_int,
    concrete_ints,
    concrete_text,
    dtype_at,
    numel,
    size_of,
)

# Positions in each schema (torch's native_functions.yaml) of stride, padding, dilation,
# transposed, output_padding. None: the op has no such argument (its default applies);
# True for transposed: a transposed-only op.
_ConvArgs = tuple[int, int, int | None, int | bool | None, int | None]
CONV_FORWARD: dict[str, _ConvArgs] = {
    **{f"aten::conv{d}d": (3, 4, 5, None, None) for d in (1, 2, 3)},
    "aten::convolution": (3, 4, 5, 6, 7),
    "aten::_convolution": (3, 4, 5, 6, 7),
    "aten::cudnn_convolution": (3, 2, 4, None, None),
    "aten::mkldnn_convolution": (4, 3, 5, None, None),
    "aten::miopen_convolution": (4, 3, 5, None, None),
    "aten::miopen_depthwise_convolution": (4, 3, 5, None, None),
    "aten::_conv_depthwise2d": (4, 5, 6, None, None),
    "aten::conv_depthwise3d": (4, 5, 6, None, None),
    "aten::slow_conv_dilated2d": (4, 5, 6, None, None),
    "aten::_slow_conv2d_forward": (4, 5, None, None, None),
    "aten::thnn_conv2d": (4, 5, None, None, None),
    "aten::slow_conv3d_forward": (4, 5, None, None, None),
    "aten::_nnpack_spatial_convolution": (4, 3, None, None, None),
    **{f"aten::conv_transpose{d}d": (3, 4, 7, True, 5) for d in (1, 2, 3)},
    "aten::cudnn_convolution_transpose": (4, 2, 5, True, 3),
    "aten::slow_conv_transpose2d": (4, 5, 7, True, 6),
}
CONV_BACKWARD = frozenset({"aten::convolution_backward", "aten::cudnn_convolution_backward"})
_BWD_TRANSPOSED, _BWD_MASK = 7, 10  # convolution_backward's transposed and output_mask

# Attention ops: (layout of q/k/v, position of the causal flag, is backward). Layout "bhsd" is
# [batch, heads, seq, dim] (the SDPA-level ops), "bshd" [batch, seq, heads, dim] (the
# flash/efficient kernels' own entry points). A flag position naming an int is xformers'
# custom_mask_type (0 none, 1 causal from the top left, 2 from the bottom right).
ATTENTION: dict[str, tuple[str, int, bool]] = {
    "aten::scaled_dot_product_attention": ("bhsd", 5, False),
    "aten::_scaled_dot_product_flash_attention": ("bhsd", 4, False),
    "aten::_scaled_dot_product_flash_attention_backward": ("bhsd", 11, True),
    "aten::_scaled_dot_product_efficient_attention": ("bhsd", 6, False),
    "aten::_scaled_dot_product_efficient_attention_backward": ("bhsd", 11, True),
    "aten::_scaled_dot_product_cudnn_attention": ("bhsd", 6, False),
    "aten::_scaled_dot_product_cudnn_attention_backward": ("bhsd", 14, True),
    "aten::_scaled_dot_product_fused_attention_overrideable": ("bhsd", 5, False),
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": ("bhsd", 13, True),
    "aten::_scaled_dot_product_flash_attention_for_cpu": ("bhsd", 4, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": ("bhsd", 7, True),
    "aten::_cudnn_attention_forward": ("bhsd", 10, False),
    "aten::_cudnn_attention_backward": ("bhsd", 14, True),
    "aten::_flash_attention_forward": ("bshd", 8, False),
    "aten::_flash_attention_backward": ("bshd", 11, True),
    "aten::_efficient_attention_forward": ("bshd", 9, False),
    "aten::_efficient_attention_backward": ("bshd", 14, True),
}
# The math path (``_scaled_dot_product_attention_math``) is not listed: it runs as bmm,
# softmax and friends, each costed on its own, forward and (through autograd) backward; it
# computes the full score matrix even when causal, and is counted as what it computes.
CAUSAL_FACTOR = 0.5  # share of the score matrix a causal mask keeps (FlashAttention's count)
ATTENTION_BACKWARD_FACTOR = 2.0  # dQ, dK, dV, dP: twice the forward matmuls


def conv_cost(name: str, d: list[list[int] | None], types: Any, concrete: Any) -> OpCost | None:
    if name in CONV_BACKWARD:
        return _conv_backward(d, types, concrete)
    stride_i, pad_i, dil_i, transposed_i, outpad_i = CONV_FORWARD[name]
    if len(d) < 2 or d[0] is None or d[1] is None:
        return None
    x, w = d[0], d[1]
    if len(x) < 3 or len(w) != len(x):
        return None
    nsp = len(x) - 2
    transposed = transposed_i is True or (
        isinstance(transposed_i, int) and not isinstance(transposed_i, bool)
        and concrete_bool(concrete, transposed_i) is True)
    stride = _spatial(concrete_ints(concrete, stride_i), nsp)
    dilation = _spatial(concrete_ints(concrete, dil_i), nsp) if dil_i is not None else [1] * nsp
    pad_text = concrete_text(concrete, pad_i)
    if pad_text in ("same", "valid"):
        padding = None if pad_text == "same" else [0] * nsp
    else:
        padding = _spatial(concrete_ints(concrete, pad_i), nsp)
        if padding is None:
            return None
    if stride is None or dilation is None:
        return None  # no Concrete Inputs (torch < 2.1): the output size is unknown
    k = w[2:]
    if transposed:
        outpad = _spatial(concrete_ints(concrete, outpad_i), nsp) if outpad_i is not None else None
        outpad = outpad or [0] * nsp
        if padding is None:
            return None
        out = [(i - 1) * s - 2 * p + dl * (kk - 1) + op + 1
               for i, s, p, dl, kk, op in zip(x[2:], stride, padding, dilation, k, outpad, strict=True)]
        macs = x[0] * x[1] * numel(x[2:]) * w[1] * numel(k)
        cout = w[1]  # per group: a lower bound of the output's channels (bytes only)
    else:
        if padding is None:  # "same"
            out = list(x[2:])
        else:
            out = [(i + 2 * p - dl * (kk - 1) - 1) // s + 1
                   for i, s, p, dl, kk in zip(x[2:], stride, padding, dilation, k, strict=True)]
        cout = w[0]
        macs = x[0] * cout * numel(out) * w[1] * numel(k)
    if any(o <= 0 for o in out):
        return None
    dt = dtype_at(types, 0)
    read_x = float(numel(x))
    if not transposed:
        # A kernel whose extent is smaller than its stride (ResNet's 1x1 stride-2 shortcut)
        # never reads the input positions between its taps: counting them would break the
        # lower bound (seen on an H200: 5.8 TB/s "achieved" on a 4.8 TB/s part).
        for s_, dl, kk in zip(stride, dilation, k, strict=True):
            read_x *= min(1.0, (dl * (kk - 1) + 1) / s_)
    nbytes = (read_x + numel(w) + x[0] * cout * numel(out)) * size_of(dt)
    return OpCost(2.0 * macs, float(nbytes), dt, KIND_MODEL)


def _spatial(v: list[int] | None, n: int) -> list[int] | None:
    """A per-dimension list from a recorded int list (torch expands one value to all)."""
    if v is None:
        return None
    if len(v) == 1:
        return v * n
    return v if len(v) == n else None


def _conv_backward(d: list[list[int] | None], types: Any, concrete: Any) -> OpCost | None:
    """grad wrt input and weight, each one forward's MACs; output_mask says which ran (the
    first layer's input gradient is not computed)."""
    if len(d) < 3:
        return None
    g, x, w = d[0], d[1], d[2]
    if g is None or x is None or w is None or len(x) < 3 or len(w) != len(x) or len(g) != len(x):
        return None
    if concrete_bool(concrete, _BWD_TRANSPOSED) is True:
        macs = x[0] * x[1] * numel(x[2:]) * w[1] * numel(w[2:])
    else:
        macs = g[0] * g[1] * numel(g[2:]) * w[1] * numel(w[2:])
    mask = concrete_bools(concrete, _BWD_MASK) or [True, True, True]
    want_input, want_weight = (mask + [True, True])[:2]
    dt = dtype_at(types, 0)
    sz = size_of(dt)
    flops = 2.0 * macs * (int(want_input) + int(want_weight))
    nbytes = 0
    if want_input:  # reads grad_output and weight, writes grad_input
        nbytes += numel(g) + numel(w) + numel(x)
    if want_weight:  # reads grad_output and input, writes grad_weight
        nbytes += numel(g) + numel(x) + numel(w)
    return OpCost(flops, float(nbytes * sz), dt, KIND_MODEL)


def attention_cost(name: str, d: list[list[int] | None], types: Any, concrete: Any) -> OpCost | None:
    layout, causal_i, backward = ATTENTION[name]
    first = 1 if backward else 0  # grad_out comes first
    if len(d) < first + 3:
        return None
    q, k, v = d[first], d[first + 1], d[first + 2]
    if q is None or k is None or v is None or len(q) != 4 or len(k) != 4 or len(v) != 4:
        return None  # variable-length (packed) batches: sequence lengths are not recorded
    if layout == "bhsd":
        heads_batch, sq, e = q[0] * q[1], q[2], q[3]
        sk, ev = k[2], v[3]
    else:
        heads_batch, sq, e = q[0] * q[2], q[1], q[3]
        sk, ev = k[1], v[3]
    flops = 2.0 * heads_batch * sq * sk * (e + ev)
    if _is_causal(concrete, causal_i):
        flops *= CAUSAL_FACTOR
    dt = dtype_at(types, first)
    out = heads_batch * sq * ev
    nbytes = (numel(q) + numel(k) + numel(v) + out) * size_of(dt)
    if backward:
        flops *= ATTENTION_BACKWARD_FACTOR
        nbytes *= 2  # reads q, k, v, out, grad_out; writes dq, dk, dv
    return OpCost(flops, float(nbytes), dt, KIND_MODEL)


def _is_causal(concrete: Any, i: int) -> bool:
    """The causal flag; not causal when unrecorded (torch < 2.1), which can only over-count
    by 2x, and the roofline check flags that."""
    flag = concrete_bool(concrete, i)
    if flag is not None:
        return flag
    mask_type = concrete_int(concrete, i)
    return mask_type in (1, 2)
