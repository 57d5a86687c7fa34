"""FLOPs counted from real traces against the analytic count of the model that made them.

Each CPU test runs a small torch model under ``torch.profiler`` with ``record_shapes=True``
(what ``gpudiag profile`` records) and compares what the analysis counts per step with the
count written down from the model's definition: 2·M·N·K for a matmul, 2·N·Cout·Hout·Wout·
(Cin/groups)·kh·kw for a convolution, 4·B·H·Sq·Sk·D for attention (half of it when causal),
the forward once and the backward twice (no input gradient for the first layer). The H100
run directories of ../shared/runs pin the same count on real GPU traces.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from gpudiag.analyzers.breakdown import cpu_work, rank_breakdown
from gpudiag.analyzers.op_args import KIND_EMBEDDING, KIND_OPTIMIZER
from gpudiag.analyzers.op_tree import counted_ops
from gpudiag.analyzers.roofline import work_bounds
from gpudiag.analyzers.trace_loader import RankTrace, load_rank
from tests.conftest import SHARED  # (one place decides where test data is)

# torch is imported by the tests that run a model, not by the module: every worker of `make
# test`'s first pass collects this module (torch's import: ~2 CPU-s), and most never run it
if TYPE_CHECKING:
    import torch
    from torch import nn

RUNS = SHARED / "runs"
STEPS = 2


def _trace(tmp_path: Path, step: Callable[[], None]) -> RankTrace:
    """Profile ``STEPS`` steps (after a skipped and a warm-up step) and load the trace."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    out = tmp_path / "rank-0.json"
    torch.manual_seed(0)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=STEPS),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(out))) as prof:
        for _ in range(2 + STEPS):
            step()
            prof.step()
    return load_rank(out)


def _model_flops_per_step(rt: RankTrace) -> list[float]:
    steps = rank_breakdown(rt, work_bounds(rt, None), cpu_work(rt))
    assert len(steps) == STEPS
    return [s.model_flops for s in steps]


def _counted(rt: RankTrace, kind: int) -> np.ndarray:
    counted, _ = counted_ops(rt)
    return np.flatnonzero(counted & (rt.cpu_kind == kind))


def _names(rt: RankTrace, idx: np.ndarray) -> set[str]:
    return {rt.names[rt.cpu_name[i]] for i in idx}


def _train_step(model: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().sum().backward()
        opt.step()
    return step


def test_mlp_with_bias_counts_every_forward_addmm(tmp_path):
    import torch
    from torch import nn

    # on the CPU addmm broadcasts its bias with an aten::copy_ inside it: that copy must not
    # be taken for the costed op and drop the addmm (MFU read about half the analytic value)
    widths, batch = [64, 128, 128, 128, 16], 32
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:], strict=False):
        layers += [nn.Linear(a, b), nn.ReLU()]
    rt = _trace(tmp_path, _train_step(nn.Sequential(*layers[:-1]), torch.randn(batch, widths[0])))
    fwd = [2 * batch * a * b for a, b in zip(widths, widths[1:], strict=False)]
    analytic = 3 * sum(fwd) - fwd[0]  # backward: weight grads, input grads but the first layer's
    for flops in _model_flops_per_step(rt):
        assert flops == pytest.approx(analytic, rel=1e-9)


def _conv_out(size: int, k: int, stride: int = 1, pad: int = 0, dil: int = 1) -> int:
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def test_convolutions_with_stride_padding_dilation_groups_and_transpose(tmp_path):
    import torch
    from torch import nn

    n, hw = 2, 64
    model = nn.Sequential(
        nn.Conv2d(3, 8, 7, stride=2, padding=3), nn.ReLU(),  # a ResNet stem
        nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.ReLU(),
        nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1),
    )
    rt = _trace(tmp_path, _train_step(model, torch.randn(n, 3, hw, hw)))
    h1 = _conv_out(hw, 7, 2, 3)
    h2 = _conv_out(h1, 3, 1, 2, 2)
    h3 = _conv_out(h2, 3, 2, 1)
    assert (h1, h2, h3) == (32, 32, 16)
    fwd = [
        2 * n * 8 * h1 * h1 * 3 * 7 * 7,
        2 * n * 8 * h2 * h2 * (8 // 4) * 3 * 3,
        2 * n * 16 * h3 * h3 * 8 * 3 * 3,
        2 * n * 16 * h3 * h3 * 8 * 4 * 4,  # transposed: every input pixel meets the kernel
    ]
    analytic = 3 * sum(fwd) - fwd[0]  # the stem computes no input gradient
    for flops in _model_flops_per_step(rt):
        assert flops == pytest.approx(analytic, rel=1e-9)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_forward_and_backward_and_the_causal_flag(tmp_path, causal):
    import torch
    from torch import nn

    b, h, s, d = 2, 4, 64, 16
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))

    def step() -> None:
        nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()

    rt = _trace(tmp_path, step)
    fwd = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
    for flops in _model_flops_per_step(rt):
        assert flops == pytest.approx(3 * fwd, rel=1e-9)  # forward + backward at 2x
    counted = np.flatnonzero(counted_ops(rt)[0] & rt.cpu_is_model_flop)
    assert any("attention" in n and n.endswith("backward") for n in _names(rt, counted))


def test_embedding_bag_is_counted_not_its_offset_arithmetic(tmp_path):
    import torch
    from torch import nn

    vocab, dim, n_idx, bags = 1000, 32, 256, 16
    bag = nn.EmbeddingBag(vocab, dim, mode="sum")
    idx = torch.randint(0, vocab, (n_idx,))
    offsets = torch.arange(0, n_idx, n_idx // bags)

    def step() -> None:
        bag.zero_grad(set_to_none=True)
        bag(idx, offsets).sum().backward()

    rt = _trace(tmp_path, step)
    ops = _counted(rt, KIND_EMBEDDING)
    assert {"aten::_embedding_bag", "aten::_embedding_bag_dense_backward"} <= _names(rt, ops)
    # one add per index and feature forward, one accumulate per index and feature backward
    assert rt.cpu_flops[ops].sum() == pytest.approx(STEPS * 2 * n_idx * dim, rel=1e-9)
    # the forward reads a row per index and writes a row per bag: a lower bound of its bytes
    fwd = [i for i in ops if rt.names[rt.cpu_name[i]] == "aten::_embedding_bag"]
    assert rt.cpu_bytes[fwd[0]] >= (n_idx + bags) * dim * 4


def _adamw_trace(tmp_path: Path, **kw: bool) -> tuple[RankTrace, int, int]:
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
    opt = torch.optim.AdamW(model.parameters(), **kw)
    x = torch.randn(16, 64)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()

    params = list(model.parameters())
    return _trace(tmp_path, step), sum(p.numel() for p in params), len(params)


def test_fused_adamw_counts_as_memory_traffic(tmp_path):
    rt, p, n_tensors = _adamw_trace(tmp_path, fused=True)
    ops = [i for i in _counted(rt, KIND_OPTIMIZER) if rt.names[rt.cpu_name[i]] == "aten::_fused_adamw_"]
    assert len(ops) == STEPS
    # reads params, grads, exp_avg, exp_avg_sq and the step counters; writes params and both
    # moments: fp32 state
    for i in ops:
        assert rt.cpu_bytes[i] == 4 * (4 * p + 3 * p + n_tensors)
        assert rt.cpu_flops[i] / rt.cpu_bytes[i] < 1  # far below any ridge: memory-bound
        assert not rt.cpu_is_model_flop[i]


def test_foreach_adamw_ops_are_costed_as_lists(tmp_path):
    rt, p, _ = _adamw_trace(tmp_path, foreach=True)
    ops = _counted(rt, KIND_OPTIMIZER)
    by_name: dict[str, list[float]] = {}
    for i in ops:
        by_name.setdefault(rt.names[rt.cpu_name[i]], []).append(float(rt.cpu_bytes[i]))
    # exp_avg.lerp_(grad): reads both lists, writes exp_avg
    assert by_name["aten::_foreach_lerp_"] == [4 * 3 * p] * STEPS
    # exp_avg_sq.addcmul_(grad, grad): reads three lists, writes one
    assert by_name["aten::_foreach_addcmul_"] == [4 * 4 * p] * STEPS
    # the per-tensor ops inside a foreach op are absorbed into it, not counted again
    counted, owner = counted_ops(rt)
    inner = [i for i in range(rt.cpu_ts.size) if rt.names[rt.cpu_name[i]] == "aten::lerp_"]
    assert inner and not counted[inner].any()
    assert all(rt.names[rt.cpu_name[owner[i]]] == "aten::_foreach_lerp_" for i in inner)


# --- the H100 run directories of ../shared/runs -------------------------------------------

def test_gpt_small_flops_per_step_match_the_readme_analytic_count():
    """12 layers, d=768, causal attention, S=512, B=16, vocab 32768: the job printed its
    analytic count (12 x (72 d^2 + 6 S d) per token + 6 d V) in its log."""
    log = (RUNS / "h100-gpt-small" / "job-plain.log").read_text()
    analytic = float(re.search(r"analytic_flops_per_step (\d+)", log).group(1))
    rt = load_rank(RUNS / "h100-gpt-small" / "traces" / "rank-0.json.gz")
    flops = [s.model_flops for s in rank_breakdown(rt, work_bounds(rt, None), cpu_work(rt))]
    assert len(flops) == 5
    # the analytic count leaves out layer-norm affine terms and the bias adds: within 0.1%
    for f in flops:
        assert f == pytest.approx(analytic, rel=1e-3)


def _resnet18_train_flops(batch: int, hw: int = 224) -> float:
    """torchvision's resnet18, written down layer by layer: (cin, cout, k, stride, out hw)."""
    convs = [(3, 64, 7, 2, hw // 2)]
    size = hw // 4  # after the stem's stride and the max-pool
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        size //= stride
        for block in range(2):
            s = stride if block == 0 else 1
            convs.append((cin if block == 0 else cout, cout, 3, s, size))
            convs.append((cout, cout, 3, 1, size))
            if block == 0 and (s != 1 or cin != cout):
                convs.append((cin, cout, 1, s, size))  # downsample
        cin = cout
    fwd = [2 * batch * co * o * o * ci * k * k for ci, co, k, _, o in convs]
    fc = 2 * batch * 512 * 1000
    return 3 * (sum(fwd) + fc) - fwd[0]  # no input gradient for the stem


def test_resnet18_flops_per_step_match_the_architecture():
    rt = load_rank(RUNS / "h100-resnet18-dl8" / "traces" / "rank-0.json.gz")
    flops = [s.model_flops for s in rank_breakdown(rt, work_bounds(rt, None), cpu_work(rt))]
    assert len(flops) == 5
    analytic = _resnet18_train_flops(batch=128)
    for f in flops:
        assert f == pytest.approx(analytic, rel=1e-9)


def test_mfu_reason_names_the_share_of_device_time_without_a_flop_formula():
    # torch 2.11 recorded no TensorList shapes, so the GPT run's fused AdamW has no cost: its
    # kernels are the bulk of the device time MFU cannot count
    from gpudiag.analyzers.diagnose import diagnose
    from gpudiag.analyzers.trace_loader import KCLASS_COMPUTE

    d = diagnose(RUNS / "h100-gpt-small", jobs=1)
    share = float(re.search(r"(\d+)% of device time is in ops without a FLOP formula", d.mfu.reason).group(1))
    rt = load_rank(RUNS / "h100-gpt-small" / "traces" / "rank-0.json.gz")
    adamw = {int(e) for e, n in zip(rt.cpu_ext, rt.cpu_name, strict=True)
             if rt.names[n] == "aten::_fused_adamw_"}
    compute = rt.gpu_class == KCLASS_COMPUTE
    in_adamw = compute & np.isin(rt.gpu_ext, list(adamw))
    adamw_share = 100 * rt.gpu_dur[in_adamw].sum() / rt.gpu_dur[compute].sum()
    assert adamw_share > 3
    assert adamw_share - 0.5 <= share <= adamw_share + 2


def test_a_loss_summed_one_scalar_at_a_time_has_its_scalar_ops_costed(tmp_path):
    """A loss written in Python over 0-dim tensors (``d = out[0, j] - y[0, j]; loss = loss +
    d * d``): torch records each sub, mul and add with dims ``[]`` and a float type. Read as
    Python numbers they were uncosted, so a stall inside one (4 ms in a 2 us sub, in the
    project's CI) was neither cut as the OS's nor judged per-call cost, and the host-bound
    workload read memory-bound. Each is a one-element tensor op: 1 FLOP, its 4-byte reads and
    write; a Python number beside it ("Scalar") adds nothing."""
    import torch

    out, y = torch.randn(1, 8), torch.randn(1, 8)

    def step() -> None:
        loss = torch.zeros(())
        for j in range(8):
            d = out[0, j] - y[0, j]
            loss = loss + d * d
    rt = _trace(tmp_path, step)
    costed = np.isfinite(rt.cpu_flops)
    for name in ("aten::sub", "aten::mul", "aten::add"):
        ops = np.flatnonzero(np.array([rt.names[n] == name for n in rt.cpu_name]))
        assert ops.size >= 8 * STEPS, name
        assert costed[ops].all(), name
        assert set(rt.cpu_flops[ops]) == {1.0}, (name, set(rt.cpu_flops[ops]))
        assert set(rt.cpu_bytes[ops]) == {12.0}, (name, set(rt.cpu_bytes[ops]))
