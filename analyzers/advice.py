"""Advice for the job in front of it: which fixes apply, what they say, what they are worth.

Each entry of ``CATALOGUE`` is one fix with a stable id, the condition under which it applies
(read from the verdict's view and from what the trace shows of the job: training or
inference, GPU or CPU, dtype, compiled or not, optimizer, DDP/FSDP, ``traits``), its text,
and its prediction (``whatif``). A fix whose condition does not hold is never printed: an
inference loop is not told to fuse its optimizer, a CPU job is not told about TF32 or CUDA
graphs, a compiled job is not told to compile. A fix that applies but would not speed the job
up (its precondition fails here, or its predicted step is not faster) is listed apart, with the
reason (``recommend``). The fixes for the verdict's label come first; within each group they
are ranked by the share of the step their prediction saves, those with no prediction after, by
the share of the step they address. Thresholds are ``classify``'s (cited there). What advice
reads is ``advice_inputs``, its words ``advice_text``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpudiag.analyzers import advice_fp32, advice_threads, blocked, omp_wait, page_faults, whatif
from gpudiag.analyzers import checkpoint as ckpt
from gpudiag.analyzers import syncs as host_syncs
from gpudiag.analyzers.advice_inputs import (  # AdviceInputs and job_cpu: the public face
    TENSOR_CORE_MULTIPLE,
    AdviceInputs,
    faster_dtype,
    fastest_lower,
    fp32_share,
    has_workers,
    job_cpu,
    on_gpu,
    slower_dtype,
    worker_count,
)
from gpudiag.analyzers.advice_text import (
    attention_text,
    autocast_after_allocator,
    batch_small_text,
    bf16_bytes_text,
    cheaper_input_text,
    comm_cost_text,
    comm_text,
    compile_small_text,
    compiled_graphs_text,
    contention_share,
    contention_text,
    copies_text,
    cpu_loading,
    exposed_share,
    fuse_text,
    fused_opt_text,
    graphs_text,
    held_share,
    input_text,
    micro_batches_text,
    near_peak_text,
    optimizer_loop_text,
    own_launch_share,
    precision_text,
    shapes_text,
    straggler_text,
    syncs_text,
    vectorise_text,
    workers_cpu_loading,
    workers_other_regime,
    workers_unmeasured,
    worst_rank,
)
from gpudiag.analyzers.classify import (
    COMM_NOTABLE,
    DEVICE_NOTABLE,
    HOST_NOTABLE,
    INPUT_MODERATE,
    LOW_MFU,
    MEMCPY_NOTABLE,
    shares,
)
from gpudiag.analyzers.comm_cost import cost
from gpudiag.analyzers.compile_facts import OptimizerLoop, optimizer_loop
from gpudiag.diagnosis import (
    Bottleneck,
    Recommendation,
)
from gpudiag.units import ms


@dataclass(frozen=True)
class Advice:
    action: str
    applies: Callable[[AdviceInputs, dict[Bottleneck, float]], bool]
    # (inputs, shares), or with ``reads_decision`` (inputs, shares, its prediction, whether it is
    # advised): a text that names a figure only where the fix helps (a worker count)
    text: Callable[..., str]
    predict: Callable[[AdviceInputs], whatif.Prediction]
    addresses: Bottleneck | None  # the share it works on (orders those without a prediction)
    # a precondition the device or the machine must meet for the fix to help at all: None when
    # it holds, else why it fails (the fix is then listed as one that would not help)
    blocked: Callable[[AdviceInputs], str | None] = lambda _a: None
    # the least predicted gain worth listing it as a thing to do (``recommend``)
    min_gain: Callable[[AdviceInputs], float] = lambda _a: MIN_GAIN
    reads_decision: bool = False


# A fix predicted to save less than this share of the step is not listed as one to do: the
# prediction's own assumptions are coarser than that (held-out zoo, attn_block: torch.compile
# listed at "-0%", 230 -> 230 ms, measured 1.65x slower).
MIN_GAIN = 0.01
# torch.compile (and bf16 autocast) on a CPU: compile's kernels replace ATen's, and where a
# job's calls are mostly work they can be the slower (blind set 10: a transformer block and a
# CNN ran 1.02x and 1.10x compiled; this project's VM, a 4-conv CNN, 1.02x, predicted -0%): a
# gain under a step timer's noise (1-4%) is no reason to compile. The jobs compile sped up by
# 14-66% on this VM were predicted 4-65% (an encoder's loop over samples 4.4%, measured 14%).
CPU_MIN_GAIN = 0.03


def _cpu_min_gain(a: AdviceInputs) -> float:
    """torch.compile's and bf16 autocast's floor: CPU_MIN_GAIN on a CPU, where autocast's casts
    are also calls and copies that the GEMMs' timing leaves out (blind set 12's host-bound MLP:
    its GEMMs 0.97x in bf16 with their casts, the job 1.08x)."""
    return MIN_GAIN if on_gpu(a) else CPU_MIN_GAIN



def _syncs_apply(a: AdviceInputs) -> bool:
    if a.syncs is not None:
        return a.syncs.share >= host_syncs.SYNC_NOTABLE
    return on_gpu(a) and a.traits.compiled and own_launch_share(a.view) >= HOST_NOTABLE


# -- conditions --------------------------------------------------------------------------------

def _bad_gemm_shapes(a: AdviceInputs) -> bool:
    for p in a.roofline.points[:10]:
        if p.bound != "compute" or p.op not in ("aten::mm", "aten::addmm", "aten::bmm",
                                               "aten::linear", "aten::matmul", "aten::baddbmm"):
            continue
        dims = [int(x) for x in re.findall(r"\d+", p.shape)]
        if any(d > 1 and d % TENSOR_CORE_MULTIPLE for d in dims):
            return True
    return False


def _lower_precision_helps(a: AdviceInputs) -> bool:
    return fp32_share(a) >= 0.5 and faster_dtype(a) is not None


def _lower_precision_applies(a: AdviceInputs) -> bool:
    """Mostly fp32 work on a device whose lower-precision peak is worth the change, or slower
    than fp32 (then it is listed as a fix that would not help, ``slower_dtype``); a family a
    little faster (under FASTER_DTYPE_MIN_RATIO) is not worth the change and is not named."""
    best = fastest_lower(a)
    return fp32_share(a) >= 0.5 and best is not None and (best[1] >= 1 or faster_dtype(a) is not None)


def _precision_predict(a: AdviceInputs) -> whatif.Prediction:
    fam, ratio = faster_dtype(a) or fastest_lower(a) or ("fp32", 1.0)
    if a.autocast is not None and fam == "bf16" and not on_gpu(a):
        return _autocast_cpu(a, ratio)
    return whatif.faster_dtype(a.view, fp32_share(a), ratio, fam)


def _autocast_cpu(a: AdviceInputs, peak_ratio: float) -> whatif.Prediction:
    """bf16 autocast on a CPU where the job's layers were timed here (``whatif.autocast_measured``):
    lower-precision and bf16-activations are the same torch.autocast line, one prediction."""
    assert a.autocast is not None
    p = whatif.autocast_measured(a.view, fp32_share(a), peak_ratio, a.autocast, a.fp32_memory_bytes,
                                 a.bandwidth, _optimizer_us(a))
    if not autocast_after_allocator(a):
        return p
    # autocast's bf16 copies are new blocks every step: under glibc's defaults they fault in
    # too. Blind set 12's two 1024x1024 layers, 256 rows: 0.70x with autocast alone, 0.51x with
    # the allocator's thresholds raised as well; predicted 0.50x. Blind check 31 (2026-12-02,
    # 2-core AMD EPYC with bf16 units): four jobs told 0.53-0.67x ran 0.47-0.66x against the
    # step with the allocator's thresholds raised, 0.31-0.50x against today's; a 2 x
    # Linear(2048) MLP at batch 4 told 0.63x ran 1.03-1.29x with autocast alone. So the
    # prediction starts from the step after allocator-keep-memory, and the text says to apply
    # it first.
    assert a.faults is not None
    before, after, _why = page_faults.predicted_step_us(a.faults)
    if before <= 0 or a.view.step_time <= 0 or p.step_us is None:
        return p
    # in the frame the other fixes are shown in: the untraced steps' wall clock where the view
    # is the traced steps (``_unobserved_frame``, which a prediction with its own start skips)
    today = a.untraced_wall_us or a.view.step_time
    start = today * min(1.0, after / before)
    return whatif.Prediction(
        start * p.step_us / a.view.step_time,
        f"from the step after allocator-keep-memory ({ms(start)}, {start / today:.2f}x today's "
        f"{ms(today)} by its own prediction): the job faults in {a.faults.faults:,.0f} pages a step now, "
        "and autocast's bf16 copies of the weights, new blocks every step, would fault in too under "
        f"glibc's defaults; the same share of that step: {p.why}",
        from_us=start, from_what="step after allocator-keep-memory")


def _bf16_bytes_predict(a: AdviceInputs) -> whatif.Prediction:
    """Half the bytes of the memory-bound fp32 work; autocast also runs the matmuls in bf16, so
    where the device's bf16 peak is below fp32's their time grows by the peaks' ratio. On a CPU
    whose run timed the job's layers, the measured prediction (``_autocast_cpu``)."""
    fp32, bf16 = a.device_peaks.get("fp32"), a.device_peaks.get("bf16")
    ratio = fp32 / bf16 if fp32 and bf16 else 1.0
    if a.autocast is not None and not on_gpu(a):
        return _autocast_cpu(a, ratio)
    return whatif.halved_bytes(a.view, fp32_share(a), a.fp32_memory_bytes, a.bandwidth,
                               gemm_ratio=ratio)


def _compiled(a: AdviceInputs) -> whatif.Prediction:
    """torch.compile's step: on a GPU its launch gaps closed and elementwise runs fused; on a
    CPU, where the operators are the host's work, its calls counted (``whatif.compiled_cpu``)."""
    f = a.compile_facts
    if on_gpu(a) or f is None or f.calls <= 0 or a.traced is None:
        return whatif.compiled(a.view, a.fusion_saved_share)
    traced = a.traced

    def at(graphs: float) -> whatif.Prediction:
        return whatif.compiled_cpu(a.view, traced, f.calls, f.kernels, graphs, f.extern_us, f.kept_us,
                                   f.syncs, loop_calls=f.loops.loop_calls, asleep_us=blocked.blocked_us(a),
                                   after_us=f.loops.after_us, work_us=f.work_us,
                                   fusable_us=f.fusable_us)

    p = at(f.graphs)
    if f.loops.module_iters < 1 or p.step_us is None:
        return p
    # a loop calling the same layers on one row at a time: compiled where the loop is, Dynamo
    # unrolls it into the one graph (the prediction); the module it calls compiled alone is a
    # graph call per iteration, forward and backward (t2-style encoder over 48 samples, this
    # project's VM: the loop's function compiled 0.86x, the encoder compiled 1.30x; blind set
    # 10's j2, the encoder and head compiled, 1.39x where 0.69x had been promised)
    per_iter = at(f.graphs + f.loops.module_iters * (2.0 if a.traits.training else 1.0))
    assert per_iter.step_us is not None
    return replace(p, why=p.why + (
        f"; it assumes the loop that calls the same layers {f.loops.module_iters:.0f} times a step "
        f"is compiled with them (Dynamo unrolls it into the graph): the module it calls compiled "
        f"alone is a graph call per iteration, and the step ≈ {ms(per_iter.step_us)} "
        f"({per_iter.step_us / a.view.step_time:.2f}x)"))


def _optimizer_loop(a: AdviceInputs) -> OptimizerLoop | None:
    """On a CPU, an optimizer that updates one tensor at a time, compiled model or not (the
    blind set's compiled models left their hand-written optimizers 53-62% of the step)."""
    f = a.compile_facts
    return None if on_gpu(a) or f is None or a.traced is None else optimizer_loop(f)


def _optimizer_loop_notable(a: AdviceInputs) -> bool:
    """The optimizer's per-tensor loop is HOST_NOTABLE of the traced step or more: below, its
    few percent are within a step timer's noise and not worth a compile (held-out jobs with
    torch.optim at 2-4% of the step were offered -2..-5% that no run measured)."""
    loop, f = _optimizer_loop(a), a.compile_facts
    return loop is not None and f is not None and f.step_us > 0 and loop.us >= HOST_NOTABLE * f.step_us


def _compiled_update(a: AdviceInputs) -> whatif.Prediction:
    loop = _optimizer_loop(a)
    assert loop is not None and a.traced is not None
    faulting = page_faults.notable(a.faults)
    p = whatif.compiled_update(a.view, a.traced, loop.us, loop.calls, loop.params,
                               where="after the backward" if loop.by_hand else "in the optimizer's step",
                               work_us=loop.work_us, events=loop.events,
                               per_event_us=a.profiler_us_per_event, profiler_us=a.profiler_step_us,
                               temporaries_fault=faulting)
    if faulting and p.step_us is not None:
        # the loop's work on larger tensors holds the page faults of its temporaries, which
        # allocator-keep-memory removes: blind set 9's AdamW job ran 0.79x with its step compiled
        # by default and 1.06x slower with it compiled after the allocator fix
        p = replace(p, why=p.why + "; part of the work it counts is the page faults of the loop's "
                    "temporaries (allocator-keep-memory): after that fix this one is worth less, "
                    "and may be worth nothing")
    return p


def _gaps_but_optimizer(a: AdviceInputs) -> whatif.Prediction:
    """A compiled CPU job's host gaps closed, but its optimizer's per-tensor loop, which has a
    fix of its own (``compile-optimizer-step``; the blind set's compiled models: every gap closed
    predicted 0.28x and 0.35x, the optimizer's step compiled on top measured 0.43x and 0.56x)."""
    loop = _optimizer_loop(a)
    if loop is None or a.traced is None or a.traced.step_time <= 0:
        return whatif.host_gaps_closed(a.view)
    return whatif.host_gaps_closed(a.view, loop.us * a.view.step_time / a.traced.step_time,
                                   "the optimizer's per-tensor loop, which compile-optimizer-step addresses")


def _rnn_eager(a: AdviceInputs) -> str | None:
    """torch.compile of a CPU model holding nn.GRU/LSTM/RNN: Dynamo runs those layers eagerly,
    forward and backward, so the calls it would replace are not the trace's (blind set 7's GRU
    job: predicted 0.70x, measured 1.00x with the model compiled)."""
    f = a.compile_facts
    if on_gpu(a) or f is None or f.rnn_calls <= 0:
        return None
    return ("torch.compile runs nn.GRU, nn.LSTM and nn.RNN eagerly (Dynamo does not trace them), "
            "forward and backward, so the model's recurrence keeps its calls; a recurrence written as "
            "a loop over time steps in the compiled module is unrolled into its graph instead")


def _forward_breaks(a: AdviceInputs) -> str | None:
    """torch.compile of a CPU model whose forward reads values back into Python (``.item()``,
    ``.tolist()``, a branch on a tensor): each read splits the compiled graph, and one inside a
    loop over the model's blocks makes Dynamo compile each block apart, every graph's call and
    guards paid per block; no count of calls prices that. Measured on this project's 2-core AMD
    EPYC (``benchmarks/compile_calls.py``, 16 trained Linear-LayerNorm-GELU blocks in one forward,
    2026-11-30): compiled 1.1-1.2 ms with no break, 3.1-3.5 ms with one, eager 1.8-2.3 ms. Held-out
    jobs the same way: 48 tiny blocks with an ``.item()`` every 3 ran 1.28-1.5x slower compiled;
    blind check 16's 16 blocks with one every 4, predicted 0.78-0.84x (once at high confidence),
    ran 1.27-1.41x."""
    f = a.compile_facts
    if on_gpu(a) or f is None:
        return None
    # the census saw where each read was (inside an nn.Module call or not); the trace places them
    # by time only, and a loop's reads after opt.step() open the next step's window before its
    # forward (blind check 40: a loss and a gradient norm read there, told "the forward reads 1
    # value a step", compile ran 0.43x)
    n = a.syncs.in_module_per_step if a.syncs is not None and a.syncs.in_module_per_step is not None \
        else f.syncs
    if n < 0.5:
        return None
    return (f"the forward reads {n:.0f} value{'s' if n >= 1.5 else ''} a step back into "
            "Python (.item(), .tolist() and the like), and each splits the "
            "compiled graph; one inside a loop over the model's blocks makes Dynamo compile each block "
            "apart, which on this CPU ran a 16-block model 1.7x slower than eager. Remove those reads "
            "first (or set torch._dynamo.config.capture_scalar_outputs = True), then compile")


def _compile_blocked(a: AdviceInputs) -> str | None:
    """Why compiling the model on a CPU would not give what its calls promise, or None."""
    return _rnn_eager(a) or _forward_breaks(a)


def _loop_found(a: AdviceInputs) -> bool:
    f = a.compile_facts
    return not on_gpu(a) and f is not None and a.traced is not None and f.loops.loop_calls > 0


def _vectorised(a: AdviceInputs) -> whatif.Prediction:
    f = a.compile_facts
    assert f is not None and a.traced is not None
    return whatif.vectorised_loop(a.view, a.traced, f.loops.loop_us, f.loops.loop_calls,
                                  f.loops.loop_iters)


def _micro_batches(a: AdviceInputs) -> bool:
    """Two or more forward/backward passes per optimizer step (gradient accumulation), on a CPU,
    where a pass's calls are the host's work and their count is the trace's."""
    f = a.compile_facts
    return (not on_gpu(a) and a.traits.training and a.traits.optimizer and f is not None
            and a.traced is not None and f.loops.passes >= 2)


def _larger_micro(a: AdviceInputs) -> whatif.Prediction:
    f = a.compile_facts
    assert f is not None and a.traced is not None
    return whatif.fewer_micro_batches(a.view, a.traced, f.loops.passes, f.opt_us, a.mfu.flops_per_step,
                                      a.mfu.peak_flops)


def _optimizer_us(a: AdviceInputs) -> float | None:
    """The optimizer's step and zero_grad per step at the view's own pace (CPU traces: its host
    time is its work: ``whatif.own_of_traced``); None where the trace does not tell it apart (a
    GPU's kernels)."""
    f, t = a.compile_facts, a.traced
    if on_gpu(a) or not a.traits.optimizer or f is None or t is None or t.step_time <= 0 or f.step_us <= 0:
        return None
    return whatif.own_of_traced(a.view, t, f.opt_us)


def _straggler(a: AdviceInputs) -> whatif.Prediction:
    st = a.stragglers
    assert st is not None
    return whatif.straggler_fixed(a.view, st.median_step_us, st.per_rank_step_us.get(str(worst_rank(st)), 0))


def _workers_step(a: AdviceInputs) -> whatif.Prediction:
    unmeasured = workers_unmeasured(a) or workers_other_regime(a)
    if unmeasured:
        return whatif.Prediction(None, unmeasured)
    return whatif.input_hidden(a.view, job_cpu(a.traits), on_gpu(a), workers=has_workers(a),
                               count=worker_count(a))


def _ckpt_predict(a: AdviceInputs) -> whatif.Prediction:
    assert a.saves is not None
    before, after, why = ckpt.predicted_step_us(a.saves)
    return whatif.Prediction(after, why, from_us=before, from_what=whatif.MEAN_UNTRACED)


def _faults_predict(a: AdviceInputs) -> whatif.Prediction:
    assert a.faults is not None
    before, after, why = page_faults.predicted_step_us(a.faults)
    return whatif.Prediction(after, why, from_us=before, from_what=whatif.MEAN_UNTRACED)


def _none(why: str) -> Callable[[AdviceInputs], whatif.Prediction]:
    return lambda _a: whatif.Prediction(None, why)


def _cheaper_input(a: AdviceInputs) -> whatif.Prediction:
    """No step: how much cheaper a batch gets is the job's choice; what each ms of it is worth."""
    n = worker_count(a)
    if workers_cpu_loading(a) is not None and n > 0:
        return whatif.Prediction(None, (
            "how much cheaper a batch gets is the job's choice: its workers make batches side by "
            f"side, so each ms of a batch's work removed shortens the step by about 1/{n} ms where "
            "the loader holds it"))
    return whatif.Prediction(None, "how much cheaper a batch gets is the job's choice: each ms of a "
                                   "batch's work removed is a ms of the wait, while the main thread loads")


CATALOGUE: list[Advice] = [
    Advice("dataloader-workers", lambda a, s: s[Bottleneck.INPUT] >= INPUT_MODERATE, input_text,
           _workers_step, Bottleneck.INPUT,
           blocked=lambda a: whatif.no_core_for_workers(a.view, job_cpu(a.traits), on_gpu(a),
                                                        workers=has_workers(a)),
           # on a CPU, a gain within the step timer's noise is no reason to add workers: blind
           # check 39's control job (a cheap loader) was told 3 workers, 0.93x, and ran 0.99x
           min_gain=_cpu_min_gain, reads_decision=True),
    Advice("cheaper-input", lambda a, s: (cpu_loading(a) and s[Bottleneck.INPUT] >= INPUT_MODERATE)
           or (workers_cpu_loading(a) is not None and held_share(a, s) >= INPUT_MODERATE),
           cheaper_input_text,
           _cheaper_input, Bottleneck.INPUT),
    Advice("overlap-communication", lambda a, s: exposed_share(a) >= COMM_NOTABLE,
           comm_text,
           lambda a: whatif.communication_overlapped(a.view, cpu=not on_gpu(a), backward_us=a.backward_us),
           Bottleneck.COMMUNICATION),
    Advice("all-reduce-less-often",
           lambda a, s: a.traits.training and s[Bottleneck.COMMUNICATION] >= COMM_NOTABLE,
           comm_cost_text, lambda a: whatif.accumulated(a.view, cost(a.view), optimizer_us=_optimizer_us(a)),
           Bottleneck.COMMUNICATION),
    # host advice on a GPU from the job's own launch overhead alone; the training thread's wait
    # for cores its own workers and threads hold has its own fix (``host_wait``)
    Advice("cuda-graphs-or-compile",
           lambda a, s: on_gpu(a) and not a.traits.compiled and own_launch_share(a.view) >= HOST_NOTABLE,
           graphs_text, lambda a: whatif.compiled(a.view, a.fusion_saved_share), Bottleneck.HOST),
    # where the syncs were counted (``syncs``), on any device, by what removing them saves;
    # else (no count at all) a compiled GPU job's host gaps, as before
    Advice("remove-host-syncs", lambda a, s: _syncs_apply(a),
           lambda a, s: host_syncs.advice_text(a.syncs) if a.syncs is not None else syncs_text(a, s),
           lambda a: (whatif.Prediction(*host_syncs.predicted_step_us(a.syncs)) if a.syncs is not None
                      else whatif.host_gaps_closed(a.view)), Bottleneck.HOST),
    # a compiled GPU job whose host gaps are not its syncs (counted, and too few to be worth
    # removing): what is left is launches, the fix CUDA graphs
    Advice("cuda-graphs",
           lambda a, s: on_gpu(a) and a.traits.compiled and a.syncs is not None
           and a.syncs.share < host_syncs.SYNC_NOTABLE and own_launch_share(a.view) >= HOST_NOTABLE,
           compiled_graphs_text, lambda a: whatif.host_gaps_closed(a.view), Bottleneck.HOST),
    # the thread asleep in a blocking call of the job's (a socket, fsync, a lock, a sleep)
    Advice("unblock-training-thread", lambda a, s: blocked.applies(a), blocked.text, blocked.predict,
           Bottleneck.HOST, blocked=blocked.unsure),
    # a CPU job's intra-op threads put to sleep at every parallel region's end (OpenMP's passive
    # wait policy): the wake-ups are in the operators' time, no share of the step
    Advice("omp-wait-policy", lambda a, s: omp_wait.applies(a), omp_wait.text, omp_wait.predict,
           None, blocked=omp_wait.no_core_to_spin),
    Advice("free-a-core", lambda a, s: contention_share(a.view) >= HOST_NOTABLE, contention_text,
           lambda a: whatif.contention_removed(a.view), Bottleneck.HOST),
    # a CPU job's intra-op threads outnumbering the cores other processes leave: the machine's
    # part of the step, which no share shows, is partly the threads waiting for one another
    Advice("fewer-intra-op-threads", lambda a, s: advice_threads.crowded(a) is not None,
           advice_threads.text, advice_threads.predict, None),
    Advice("compile-small-ops",
           lambda a, s: not on_gpu(a) and not a.traits.compiled and s[Bottleneck.HOST] >= HOST_NOTABLE,
           compile_small_text, _compiled, Bottleneck.HOST, blocked=_compile_blocked,
           min_gain=_cpu_min_gain),
    # an optimizer that updates one tensor at a time (a Python loop of the job's own after the
    # backward, or torch.optim's default on a CPU): compile of the model does not reach it
    Advice("compile-optimizer-step", lambda a, s: _optimizer_loop_notable(a), optimizer_loop_text,
           _compiled_update, Bottleneck.HOST),
    # a Python loop over samples (a per-sample loss): compile of the model does not reach it
    Advice("vectorise-sample-loop", lambda a, s: _loop_found(a), vectorise_text, _vectorised,
           Bottleneck.HOST),
    # gradient accumulation over many small micro-batches: each pays a whole pass's calls
    Advice("larger-micro-batches", lambda a, s: _micro_batches(a), micro_batches_text, _larger_micro,
           Bottleneck.HOST),
    Advice("batch-small-ops",
           lambda a, s: not on_gpu(a) and a.traits.compiled and s[Bottleneck.HOST] >= HOST_NOTABLE,
           batch_small_text, _gaps_but_optimizer, Bottleneck.HOST),
    # torch.compile once: where the host advice above already names it, not again for memory
    Advice("fuse-memory-bound",
           lambda a, s: not a.traits.compiled and s[Bottleneck.MEMORY] >= DEVICE_NOTABLE
           and a.view.memory_bound > 0 and s[Bottleneck.HOST] < HOST_NOTABLE,
           fuse_text, _compiled, Bottleneck.MEMORY, blocked=_compile_blocked,
           min_gain=_cpu_min_gain),
    Advice("bf16-activations",
           lambda a, s: s[Bottleneck.MEMORY] >= DEVICE_NOTABLE and a.view.memory_bound > 0
           and fp32_share(a) >= 0.5 and "bf16" in a.device_peaks,
           bf16_bytes_text, _bf16_bytes_predict, Bottleneck.MEMORY,
           blocked=lambda a: slower_dtype(a, ("bf16",)), min_gain=_cpu_min_gain),
    # a GPU's: one kernel per parameter tensor is what fusing removes; on a CPU, 14 held-out
    # jobs it was listed for measured 0.95-1.72x with it applied, never a clear gain
    Advice("fused-optimizer",
           lambda a, s: on_gpu(a) and a.traits.optimizer and not a.traits.fused_optimizer
           and max(s[Bottleneck.MEMORY], s[Bottleneck.HOST]) >= DEVICE_NOTABLE,
           fused_opt_text,
           _none("the optimizer's share of the step is not separated in the breakdown"),
           Bottleneck.MEMORY),
    Advice("pinned-async-copies",
           lambda a, s: on_gpu(a) and a.view.step_time > 0
           and a.view.memcpy_exposed / a.view.step_time >= MEMCPY_NOTABLE,
           copies_text, lambda a: whatif.copies_hidden(a.view), Bottleneck.MEMORY),
    Advice("lower-precision",
           lambda a, s: s[Bottleneck.COMPUTE] >= DEVICE_NOTABLE and _lower_precision_applies(a),
           precision_text, _precision_predict, Bottleneck.COMPUTE,
           blocked=lambda a: slower_dtype(a, ("bf16", "fp16", "tf32")), min_gain=_cpu_min_gain),
    # the way back: lower precision on a device whose peak for it is below fp32's
    Advice("fp32-instead", advice_fp32.applies, advice_fp32.text, advice_fp32.predict,
           Bottleneck.COMPUTE),
    Advice("fused-attention",
           lambda a, s: on_gpu(a) and a.traits.attention and not a.traits.sdpa
           and s[Bottleneck.COMPUTE] + s[Bottleneck.MEMORY] >= DEVICE_NOTABLE,
           attention_text,
           _none("the trace does not show how much of the matmul and softmax time a fused kernel "
                 "would keep"), Bottleneck.COMPUTE),
    Advice("tensor-core-shapes",
           lambda a, s: on_gpu(a) and s[Bottleneck.COMPUTE] >= DEVICE_NOTABLE and a.mfu.value is not None
           and a.mfu.value < LOW_MFU and _bad_gemm_shapes(a),
           shapes_text, _none("the speed of a padded GEMM depends on the kernel chosen"),
           Bottleneck.COMPUTE),
    Advice("fewer-flops",
           lambda a, s: s[Bottleneck.COMPUTE] >= DEVICE_NOTABLE and a.mfu.value is not None
           and a.mfu.value >= LOW_MFU and not _lower_precision_helps(a),
           near_peak_text, _none("a smaller model or more devices change the job, not its speed"),
           Bottleneck.COMPUTE),
    # a periodic save on the training thread: host work no operator shows
    Advice("checkpoint-less-often",
           lambda a, s: a.saves is not None and a.saves.share >= ckpt.SAVE_NOTABLE,
           lambda a, s: ckpt.text(a.saves),
           _ckpt_predict,
           Bottleneck.HOST),
    # MB-sized temporaries unmapped on free and faulted in again: kernel time inside operators
    Advice("allocator-keep-memory",
           lambda a, s: page_faults.notable(a.faults),
           lambda a, s: page_faults.text(a.faults),
           _faults_predict,
           Bottleneck.HOST),
    Advice("fix-straggler", lambda a, s: a.stragglers is not None and bool(a.stragglers.ranks),
           straggler_text, _straggler, None),
]
ACTIONS = [c.action for c in CATALOGUE]


@dataclass
class Advised:
    """The fixes to do, first those for the verdict's label; and those that apply to the job's
    bottleneck but would not speed it up here (``Verdict.not_advised``)."""

    advised: list[Recommendation]
    not_advised: list[Recommendation]


def _not_helping(rec: Recommendation, reason: str, keep_prediction: bool) -> Recommendation:
    """The fix as one that would not help: the reason, and the prediction where it is the reason
    (a precondition that fails makes the prediction, which assumed it, meaningless)."""
    if not keep_prediction:
        return replace(rec, why=f"would not help: {reason}", predicted_step_s=None, gain=None,
                       best_step_s=None)
    return replace(rec, why=f"would not help: {reason}" + (f". The prediction: {rec.why}" if rec.why else ""))


# Where other processes crowd a CPU job's intra-op threads (``advice_threads.crowded``), the fix for
# that leads the list, ahead of the fixes for the verdict's label: the label is of the job's own
# pace, whose confidence that crowding lowered, and on the machine as it is the threads' wait for
# one another is the step. Blind checks 21, 22 and 23 (2-core VM, busy loops beside eleven jobs
# written for them): one intra-op thread ran 0.14-0.71x by the mean step, the largest change of
# any fix applied in ten of the eleven (the eleventh's allocator fix ran 0.59x, threads 0.71x),
# where the entry, unpredicted, was listed last.
CROWDING_FIRST = "fewer-intra-op-threads"
# (where the job's operators are short: long ones amortise the wait at their ends,
# ``advice_threads.long_operators``; blind check 24's 2048-wide MLP, 5.9 ms a call, ran 0.96-1.00x
# with one thread, and its lower-precision entry 0.68-0.73x, told 0.78x)


# Fixes that shorten the job's own operator work (its GEMMs in bf16), whose saving is taken from
# the view's own-pace parts. Beside other processes the machine's part of a step is not a fixed
# time: they take a share of the cores' time, so each ms of its own work the job no longer does
# shortens its wall step by 1/(1 - their share). Subtracted 1:1 (the machine's part kept), blind
# checks 25 and 26 (2-core VM, busy loops, their part 50% of each step) measured bf16 autocast at
# 0.57-0.63x where 0.76-0.89x was told, the saving 2-4x the told one.
OWN_WORK_FIXES = frozenset({"lower-precision", "bf16-activations"})


def _machine_share(a: AdviceInputs, c: Advice, p: whatif.Prediction) -> float | None:
    """Other processes' share of the view's step, where an own-work fix's saving is to be
    scaled by it (a CPU job, the prediction from the view's step, their share a tenth or more)."""
    if c.action not in OWN_WORK_FIXES or p.from_us is not None or on_gpu(a):
        return None
    m = a.view.fraction("host_stalled")
    return m if HOST_NOTABLE <= m < 0.95 else None


def _at_machine_share(step_s: float, x: float | None, m: float) -> float | None:
    """A predicted step ``x`` (s) of a fix that saves ``step_s - x`` of the job's own work, where
    other processes take ``m`` of the step: that saving over ``1 - m``; kept as it is where the
    saving is more than the job's own part (then it already counted theirs)."""
    if x is None or step_s - x > (1 - m) * step_s:
        return x
    return step_s - (step_s - x) / (1 - m)


def _unobserved_frame(a: AdviceInputs, p: whatif.Prediction) -> float | None:
    """Where the view is the traced steps (the reference around the window not trusted), what
    brings a prediction made on them to the untraced steps' wall step, the one the job's own
    timer reads and a run with the fix applied is measured against: the ratio kept, the frame
    the job's. None where the view's step is already that frame, or the prediction names the
    step it starts from (``Prediction.from_us``). Blind check 22: a job crowded in its traced
    window was told "1,467 ms -> ..." where its own timer read 112 ms a step."""
    if a.untraced_wall_us is None or p.from_us is not None or a.view.step_time <= 0:
        return None
    k = a.untraced_wall_us / a.view.step_time
    return k if abs(k - 1) > 1e-3 else None


# Fixes the loader's pace does not bound: they change the loading itself
LOADER_FIXES = frozenset({"dataloader-workers", "cheaper-input"})


def _loader_pace(a: AdviceInputs, action: str, step_s: float) -> tuple[float, str] | None:
    """The least step (s) the job's DataLoader workers can feed (``whatif.loader_pace``), where
    a fix to the rest of the job is bounded by it, and why in words; None where it is not, or
    not recorded. No more than today's step ``step_s``: a loader feeds the step it feeds, and its
    workers' time on a core or waiting for one can read longer than that step where they and the
    training thread wait for the same cores (blind check 40: "113 ms -> 120 ms (+7%) ... the step
    cannot be shorter than its DataLoader's pace, 120 ms", for two fixes to the training thread);
    there the loader holds the step and the fix would not shorten it."""
    busy, n = a.traits.workers_busy_s, worker_count(a)
    if action in LOADER_FIXES or busy is None:
        return None
    floor = whatif.loader_pace(busy * 1e6, n)
    if floor is None:
        return None
    each = f" (each makes a batch in {n} steps)" if n > 1 else ""
    took = (f"its {n} worker{'s' if n > 1 else ''} took {ms(busy * 1e6)} a step on a core or waiting "
            f"for one over the untraced steps{each}")
    # the pace is a mean over the untraced steps: held against their mean too, where the step a
    # fix starts from is a median (blind check 41: a pace of 59 ms, a mean step of 57.5 ms and a
    # median of 65.6 ms read "65.6 ms -> 59 ms (-10%)"; the compiled optimizer step ran 1.09-1.11x)
    mean_s = a.traits.cpu_step_s or step_s
    if floor * 1e-6 >= min(step_s, mean_s):
        return step_s, (f"but its DataLoader holds the step: {took}, no less than the step itself "
                        f"({ms(min(step_s, mean_s) * 1e6)}"
                        + (", the untraced steps' mean" if mean_s < step_s else "")
                        + "), which this fix does not change")
    return floor * 1e-6, (
        f"but the step cannot be shorter than its DataLoader's pace, {ms(floor)}: {took}, "
        "which this fix does not change")


def recommend(a: AdviceInputs) -> Advised:
    """The fixes that apply to this job: first those for the verdict's label (or its tie), then
    the others, each group ranked by what they are predicted to save (``CROWDING_FIRST`` leads
    where it applies). A fix is never listed as a
    thing to do where it would not speed the job up: its precondition fails here (``Advice
    .blocked``), or its predicted step is not faster than today's; it goes to ``not_advised``
    with the reason instead."""
    if a.view.step_time <= 0:
        return Advised([], [])
    s = shares(a.view)
    fits = {x for x in (a.label, a.tie_with) if x is not None}
    out: list[tuple[tuple[int, int, float], Recommendation]] = []
    refused: list[Recommendation] = []
    for c in CATALOGUE:
        if not c.applies(a, s):
            continue
        p = c.predict(a)
        step_s = (a.view.step_time if p.from_us is None else p.from_us) * 1e-6
        pred = None if p.step_us is None else max(0.0, p.step_us) * 1e-6
        gain = None if pred is None else 1 - pred / step_s
        best = None if p.best_us is None or pred is None else min(pred, max(0.0, p.best_us) * 1e-6)
        m = _machine_share(a, c, p)
        if m is not None and pred is not None:
            pred, best = _at_machine_share(step_s, pred, m), _at_machine_share(step_s, best, m)
            gain = None if pred is None else 1 - pred / step_s
            p = replace(p, why=(p.why + "; " if p.why else "") + (
                f"other processes took {m:.0%} of the step: they take a share of the cores' time, "
                f"not a fixed part of each step, so each ms of its own work saved shortens the step "
                f"by {1 / (1 - m):.2g} ms"))
        k = _unobserved_frame(a, p)
        step_from = (p.from_what or "step") if p.from_us is not None else (
            whatif.MEDIAN_UNTRACED if k is not None else a.view_step)
        if k is not None:
            step_s *= k
            pred, best = (None if x is None else x * k for x in (pred, best))
        if k is not None and pred is not None:
            p = replace(p, why=(p.why + "; " if p.why else "") + (
                f"predicted on the traced steps ({ms(a.view.step_time)} by wall clock: the profiler's "
                f"cost and other processes' part in them) and shown at the untraced steps' "
                f"{ms(step_s * 1e6)} by the same ratio"))
        paced = _loader_pace(a, c.action, step_s)
        if paced is not None and pred is not None and pred < paced[0]:
            pred, best = paced[0], (None if best is None else max(best, paced[0]))
            gain = 1 - pred / step_s
            p = replace(p, why=(p.why + "; " if p.why else "") + paced[1])
        blocked = c.blocked(a)
        floor = c.min_gain(a)
        slower = pred is not None and gain is not None and gain < floor  # gain is None exactly when pred is
        text = c.text(a, s, p, blocked is None and not slower) if c.reads_decision else c.text(a, s)
        rec = Recommendation(action=c.action, text=text, predicted_step_s=pred, why=p.why,
                             step_s=step_s, gain=gain, best_step_s=best, step_from=step_from)
        if blocked is not None:
            refused.append(_not_helping(rec, blocked, keep_prediction=False))
            continue
        if slower:
            assert pred is not None and gain is not None
            maybe = (f"; at its other end it would be {ms(best * 1e6)} ({best / step_s:.2f}x): only "
                     "a run with it applied can tell" if best is not None and 1 - best / step_s >= floor
                     else "")
            refused.append(_not_helping(
                rec, f"its predicted step ({ms(pred * 1e6)}) is not faster than today's "
                     f"({ms(step_s * 1e6)})" + (f" by {floor:.0%} or more" if gain > 0 else "") + maybe,
                keep_prediction=True))
            continue
        first = 0 if c.addresses in fits else 1
        key = (first, 0, -gain) if gain is not None else (
            first, 1, -(s[c.addresses] if c.addresses else 1.0))
        if c.action == CROWDING_FIRST:
            # short operators: it leads; long: after the fixes with a prediction of their own
            # (its middle is a guess between two ends, not a prediction to rank by)
            key = (-1, 0, 0.0) if advice_threads.long_operators(a) is None else (first, 1, 0.0)
        out.append((key, rec))
    out.sort(key=lambda kv: kv[0])
    advised = [r for _, r in out]
    actions = {r.action for r in advised}
    if not on_gpu(a) and {"lower-precision", "bf16-activations"} <= actions:
        # one torch.autocast line: on a CPU it runs the GEMMs and convolutions in bf16 and the
        # measured change is the GEMMs' (blind set 11: autocast 0.813x and 0.630x where
        # lower-precision said 0.777x and 0.654x, and the two added said 0.60x and 0.63x)
        act = next(r for r in advised if r.action == "bf16-activations")
        advised.remove(act)
        refused.append(_not_helping(act, "the same torch.autocast change as lower-precision, listed "
                                         "above; on a CPU its measured gain is the GEMMs' and convolutions', "
                                         "this one's is not added to it", keep_prediction=False))
    return Advised(advised, refused)
