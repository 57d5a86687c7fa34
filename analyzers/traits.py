"""What the trace shows of the job, so that advice fits the job in front of it.

An inference loop has no optimizer to fuse; a job already under ``torch.compile`` gains
nothing from being told to compile; CUDA graphs, TF32 and tensor-core shapes mean nothing on
a CPU. Each trait is read from the names the profiler recorded (operators, annotations), so
it needs nothing beyond the trace: the annotations are PyTorch's own (``Optimizer.step#``,
``DistributedDataParallel.forward``, ``Torch-Compiled Region``, autograd's
``evaluate_function``), present whatever the job's code looks like.
"""

from __future__ import annotations

import re

from gpudiag.analyzers.host_cpu import HostCpu
from gpudiag.diagnosis import JobTraits

# (trait, pattern over recorded names). Sources: torch/optim/optimizer.py (profile_hook_step
# names "Optimizer.step#<Class>.step"), torch/nn/parallel/distributed.py ("DistributedDataParallel
# .forward"), torch/distributed/fsdp (the "FullyShardedDataParallel." and "FSDP::" record
# functions), torch/_dynamo and torch/_inductor ("Torch-Compiled Region", "CompiledFunction",
# "## Call CompiledFxGraph"), autograd's "autograd::engine::evaluate_function: XBackward0".
_PATTERNS: dict[str, re.Pattern[str]] = {
    "training": re.compile(r"^autograd::engine::evaluate_function|Backward\d*$"),
    "optimizer": re.compile(r"^Optimizer\.step#|^aten::_fused_(adamw?|sgd|adagrad)_|^aten::_foreach_"),
    "fused_optimizer": re.compile(r"^aten::_fused_(adamw?|sgd|adagrad)_|^aten::_foreach_"),
    "compiled": re.compile(r"^Torch-Compiled Region|^CompiledFunction|^## Call CompiledFxGraph|"
                           r"^TorchDynamo Cache Lookup"),
    "ddp": re.compile(r"^DistributedDataParallel\.forward"),
    "fsdp": re.compile(r"^FullyShardedDataParallel\.|^FSDP::"),
    "sdpa": re.compile(r"^aten::(scaled_dot_product_attention|_scaled_dot_product_"
                       r"(flash|efficient|cudnn)_attention|_flash_attention_forward)"),
    "softmax": re.compile(r"^aten::_?softmax$"),
    "bmm": re.compile(r"^aten::(bmm|baddbmm)$"),
}


def rank_traits(names: list[str], dataloader_iters: list[str]) -> dict[str, bool]:
    """Trait flags of one rank, from its string table of recorded names."""
    found = {k: False for k in _PATTERNS}
    for n in names:
        for k, rx in _PATTERNS.items():
            if not found[k] and rx.search(n):
                found[k] = True
    found["single_process_loader"] = any("SingleProcess" in it for it in dataloader_iters)
    return found


def job_traits(per_rank: list[dict[str, bool]], dataloader_workers: list[int] | None = None,
               host: HostCpu | None = None, loader_busy: float | None = None,
               workers_busy: float | None = None) -> JobTraits:
    """The job's traits: a trait any rank shows (ranks run the same code)."""
    def any_of(k: str) -> bool:
        return any(r.get(k, False) for r in per_rank)

    return JobTraits(
        training=any_of("training"), optimizer=any_of("optimizer"),
        fused_optimizer=any_of("fused_optimizer"), compiled=any_of("compiled"), ddp=any_of("ddp"),
        fsdp=any_of("fsdp"), attention=any_of("softmax") and any_of("bmm"), sdpa=any_of("sdpa"),
        single_process_loader=any_of("single_process_loader"),
        dataloader_workers=sorted(set(dataloader_workers or [])),
        cores_used=host.cores_used if host else None, runq_cores=host.runq_cores if host else None,
        other_cores=host.other_cores if host else None,
        cpus=host.cpus if host else None,
        intra_op_threads=host.intra_op_threads if host else None,
        cpu_step_s=host.step_s if host else None,
        proc_cores=host.proc_cores if host else None,
        loader_busy=loader_busy,
        workers_busy_s=workers_busy,
        wants=host.wants if host else None,
        others_runnable=host.others_runnable if host else None,
    )
