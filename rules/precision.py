"""GD311 and GD315: the precision the step's matrix work runs in, a rung of the ladder each: fp32 to TF32, then bf16."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor import Finding, NotEvaluated, Remedy, Run, rule
from gpudoctor.analysis import Budget, Precision, Throughput, precision_option

FP32_KINDS = ("fp32_gemm", "fp32_conv", "fp32_attention")
TF32_LINE = 'torch.set_float32_matmul_precision("high")'
BF16_LINE = 'with torch.autocast("cuda", dtype=torch.bfloat16): loss = ...'


@rule("GD311", "matmuls-without-tensor-cores", category="precision")
def matmuls_without_tensor_cores(run: Run, min_impact: float = 0.1, tf32_speedup: float = 6.0) -> Iterator[Finding]:
    """The GPU runs its matrix products in fp32 on CUDA cores, where its Tensor Cores would run them in TF32 or bf16.

    What it detects: on a GPU with Tensor Cores for TF32 and bf16 (compute capability 8.0 or later, from the
    trace's deviceProperties), the step's GEMM and convolution kernels that run fp32 math on CUDA cores, told by
    their names (`sm80_xmma_gemm_f32f32_f32f32_..._ffma`, `cutlass_80_simt_sgemm_*`, `sgemm_*`; the fp32
    memory-efficient attention `fmha_cutlass*_f32`), when turning TF32 on would save at least `min_impact` of
    the step. GEMMs count for TF32 only while none runs in TF32 yet (matmul TF32 is off), convolutions only
    while none does (cuDNN's TF32 is on by default); matrix-vector kernels (gemv) are bound by memory and do
    not count. A run already in TF32 or bf16 (`..._tf32f32_...`, `nvjet_..._h_...`) draws nothing.

    Why it matters: PyTorch's default fp32 matmul precision is "highest": every Linear and attention product
    runs on the CUDA cores, at a fraction of what the Tensor Cores do (an H100's dense TF32 peak is 7.4 times
    its fp32 one, bf16 twice that again). Lightning warns of it at start-up; the step gets none of it back.

    Example: a GPT-style model trained in fp32 on an H100: its `sm80_xmma_gemm_f32f32_f32f32_..._ffma` kernels
    take most of the GPU's time.

    Fix: `torch.set_float32_matmul_precision("high")` once, before training (TF32: fp32 storage, a 10-bit
    mantissa in the products); or bf16 autocast around the forward and the loss, `with
    torch.autocast("cuda", dtype=torch.bfloat16): loss = model(x) ...` (no GradScaler needed with bf16). Both
    change the numerics: `gpudoctor profile --try-fixes=all` runs the script with TF32 and reports the step it
    measured and how far the loss moved from the diagnosed run's.

    Impact: the fp32 kernels' share of the GPU's computing (their share of the analysed steps' kernel time, of
    the budget's GPU-computing slice at the run's pace) that TF32 reaches, made `tf32_speedup` times faster, less the
    GPU's idle at the run's pace (a step whose host sets its pace gains nothing from faster kernels: the GPU
    idles the longer), within the budget's GPU-computing slice. The factor is measured on precision_fp32_bad and its
    TF32 twin, recorded on an H100 (137.6 ms a step against 50.6 ms), against the peak ratio of 7.4x. The evidence
    adds the step with bf16 autocast, as GD315 sizes that rung (its measured rates: fp32 products 13.8 times
    faster, fp32 attention 5.9 times, the rest as long): 28.7 ms against the bf16 twin's measured 23.4 ms.
    """
    run.require_gpu()
    run.require_steps()
    found = run.gpu_work.precision
    budget = run.budget
    if found is None or budget is None:
        raise NotEvaluated("the analysed steps ran no kernel on the GPU")
    if found.tensor_cores is None:
        raise NotEvaluated("the trace does not give the device's compute capability (deviceProperties)")
    if not found.tensor_cores:
        return
    step, idle_s, computing_s = budget.step_s, budget.idle_share * budget.step_s, budget.seconds("gpu_busy")
    tf32_s = found.share(*found.tf32_reaches) * computing_s  # of the GPU's computing at the run's pace
    fp32_s = found.share(*FP32_KINDS) * computing_s
    tf32_saving = max(0.0, tf32_s * (1 - 1 / tf32_speedup) - idle_s)
    bf16_saving = bf16_what_if(found, budget)[2]
    impact = min(tf32_saving / step, budget.share_of("precision"))
    if impact < min_impact:
        return
    yield Finding(
        f"{found.share(*FP32_KINDS):.0%} of the GPU's time goes to fp32 matrix kernels on CUDA cores, not to the "
        "Tensor Cores",
        impact=impact, location=run.sites.forward_location or run.sites.backward_location,
        evidence=_evidence(found, fp32_s, step, tf32_saving, bf16_saving),
        fix=_fix(run, step - tf32_saving, step - bf16_saving),
        remedy=Remedy(matmul_precision="high"),
    )


def _evidence(found: Precision, fp32_s: float, step: float, tf32_saving: float,
              bf16_saving: float) -> dict[str, object]:
    top = found.top_fp32[0].name if found.top_fp32 else None
    return {
        "device": f"{found.device or 'GPU'} (compute capability {found.capability:.1f})",
        "fp32 matrix kernels, share of GPU time": (round(found.share(*FP32_KINDS) * 100), "%"),
        "fp32 matrix kernels per step": (round(fp32_s * 1e3, 2), "ms"),
        "step with TF32 (est.)": (round((step - tf32_saving) * 1e3, 2), "ms"),
        "step with bf16 autocast (est.)": (round((step - bf16_saving) * 1e3, 2), "ms"),
        "longest fp32 kernel": top[:120] if top else None,
    }


def _fix(run: Run, tf32_step: float, bf16_step: float) -> str:
    frameworks = run.host.env.frameworks
    if "transformers" in frameworks:
        tf32, bf16 = "TrainingArguments(tf32=True)", "TrainingArguments(bf16=True)"
    elif "lightning" in frameworks:
        tf32, bf16 = f"{TF32_LINE} before trainer.fit", 'Trainer(precision="bf16-mixed")'
    else:
        tf32, bf16 = f"{TF32_LINE} before training", f"bf16 autocast around the forward and loss ({BF16_LINE})"
    return (f"{tf32} (TF32: ~{tf32_step * 1e3:.1f} ms/step, est.), or {bf16} (~{bf16_step * 1e3:.1f} ms/step, est.); "
            "both change the numerics: --try-fixes=all measures the TF32 step and how far the loss moves")


# The rates a rung down to bf16 runs each kind of the step's GPU work at, against the precision it runs in now,
# measured on an H200 (bench/precision_rates.py, bench/results/precision_rates.json: a GPT-2-small layer's products,
# attention and elementwise work, forward and backward).
BF16_RATES = {
    "tf32_gemm": 2.67,  # TF32 products against bf16 ones on the Tensor Cores
    "fp32_gemm": 13.8,  # fp32 on CUDA cores against bf16: 5.17 (to TF32) × 2.67
    "fp32_attention": 5.9,  # the memory-efficient fp32 kernel against flash attention in bf16
}
# Convolutions are left out: no recorded pair measured what bf16 makes of them (cuDNN's bf16 kernels want a
# channels-last layout, which autocast does not give a model), so no rung is sized on them.
# The rest of the GPU's computing (norms, activations, softmax, the loss, the optimizer) under autocast: it keeps
# norms, softmax and losses in fp32 and adds casts, so it runs about as long as before. Measured on the recorded
# twins: 8.5 against 10.0 ms (precision_tf32_gpt_bad, H200), 15.9 against 15.0 ms (precision_fp32_bad, H100), where
# the same work in bf16 tensors would run 1.66 times faster (bench/precision_rates.py).
AUTOCAST_REST_RATE = 1.0
AUTOCAST_REMEDY = Remedy(autocast="bfloat16", matmul_precision="high")


@rule("GD315", "matmuls-not-in-bf16", category="precision")
def matmuls_not_in_bf16(run: Run, min_impact: float = 0.1) -> Iterator[Finding]:
    """The step's matrix work runs in TF32 or fp32 on a GPU whose Tensor Cores would run it in bf16 at about
    twice TF32's rate, and its attention in fp32.

    What it detects: on a GPU with bf16 Tensor Cores (compute capability 8.0 or later, from the trace's
    deviceProperties), the step's products and attention in TF32 or fp32 (convolutions are not sized: no
    recorded pair measured them in bf16) (by the kernels' names,
    analysis.precision: `sm90_xmma_gemm_f32f32_tf32f32_...`, the memory-efficient attention's
    `fmha_cutlassF_f32...`), where bf16 autocast would save at least `min_impact` of the step. The next rung
    after GD311's TF32: a script that turns TF32 on itself (nanoGPT's does) draws this one; one still in fp32 draws
    GD311, whose evidence and fix give the bf16 step beside TF32's. A step already in bf16 or fp16 draws nothing.

    Why it matters: TF32 runs the products on the Tensor Cores at a fraction of their bf16 rate (an H200's dense
    peaks: 495 TFLOP/s in TF32, 989 in bf16), and attention in fp32 cannot use flash attention: a GPT's step in
    TF32 spends most of its time where bf16 would take less than half.

    Example: a GPT-2-small-shaped model (12 layers of width 768) trained on 8 × 1024 tokens with TF32 on: TF32
    GEMMs and fp32 memory-efficient attention take 81% of the GPU's time.

    Fix: bf16 autocast around the forward and the loss: `with torch.autocast("cuda", dtype=torch.bfloat16): loss =
    model(x) ...` (no GradScaler with bf16; the weights and the optimizer stay fp32), or the script's own
    precision option where it has one (`--dtype bfloat16`). It changes the numerics: `gpudoctor profile
    --try-fixes=all` runs the script under autocast and reports the step it measured and how far the loss moved.
    On a GPU with fp8 Tensor Cores (compute capability 8.9 and later) the fix adds fp8 training as advice, with no
    size: no recorded pair measured it.

    Impact: the step's GPU computing at the run's pace with each kind of matrix work made faster by its measured
    rate (BF16_RATES: TF32 products 2.67×, fp32 ones 13.8×, fp32 attention 5.9×, on an H200) and the rest as long
    as before (AUTOCAST_REST_RATE), less the GPU's idle at that pace, which a faster GPU leaves to the host.
    precision_tf32_gpt_bad (H200): 56% predicted against its bf16 twin's measured 56% (46.0 → 20.1 ms).
    """
    run.require_gpu()
    run.require_steps()
    found, budget = run.gpu_work.precision, run.budget
    if found is None or budget is None:
        raise NotEvaluated("the analysed steps ran no kernel on the GPU")
    if found.tensor_cores is None:
        raise NotEvaluated("the trace does not give the device's compute capability (deviceProperties)")
    if not found.tensor_cores or ("fp32_gemm" in found.tf32_reaches and found.share("fp32_gemm") > 0):
        return  # no Tensor Cores, or TF32's rung is still to take: GD311's, which gives the bf16 step beside it
    slow, after_s, saving = bf16_what_if(found, budget)
    if not slow:
        return
    computing_s, step = budget.seconds("gpu_busy"), budget.step_s
    impact = min(saving / step, budget.share_of("precision"))
    if impact < min_impact:
        return
    matrix = sum(slow.values())
    faster = matrix * computing_s / after_s if after_s > 0 else 0.0
    yield Finding(
        f"{matrix:.0%} of the GPU's time goes to matrix work in {_rungs(slow)}, which bf16 autocast would run "
        f"{faster:.1f}× as fast",
        impact=impact, location=run.sites.forward_location or run.sites.backward_location,
        evidence=_bf16_evidence(found, slow, computing_s, step, saving, run.throughput),
        fix=_bf16_fix(run, step - saving, found.capability),
        remedy=AUTOCAST_REMEDY,
    )


def bf16_what_if(found: Precision, budget: Budget) -> tuple[dict[str, float], float, float]:
    """The step's GPU computing under bf16 autocast: the share of the GPU's time in each kind of matrix work it
    speeds up, those kinds' seconds a step after it (at BF16_RATES), and what it saves of the step at the run's
    pace: the computing it removes (the rest as long as before, AUTOCAST_REST_RATE) less the GPU's idle, which a
    faster GPU leaves to the host."""
    slow = {kind: found.share(kind) for kind in BF16_RATES if found.share(kind) > 0}
    computing_s, idle_s = budget.seconds("gpu_busy"), budget.idle_share * budget.step_s
    after_s = sum(share * computing_s / BF16_RATES[kind] for kind, share in slow.items())
    rest_s = (1 - sum(slow.values())) * computing_s / AUTOCAST_REST_RATE
    return slow, after_s, max(0.0, computing_s - after_s - rest_s - idle_s)


def _rungs(slow: dict[str, float]) -> str:
    """'TF32 and fp32 attention': the precisions the slow kinds run in."""
    names = {"tf32_gemm": "TF32", "fp32_gemm": "fp32", "fp32_attention": "fp32 attention"}
    rungs = list(dict.fromkeys(names[kind] for kind in sorted(slow, key=lambda k: -slow[k])))
    return " and ".join(rungs)


def _bf16_evidence(found: Precision, slow: dict[str, float], computing_s: float, step: float, saving: float,
                   throughput: Throughput | None) -> dict[str, object]:
    evidence: dict[str, object] = {
        "device": f"{found.device or 'GPU'} (compute capability {found.capability:.1f})"}
    labels = {"tf32_gemm": "TF32 products", "fp32_gemm": "fp32 products", "fp32_attention": "fp32 attention"}
    for kind, share in sorted(slow.items(), key=lambda item: -item[1]):
        evidence[f"{labels[kind]}, share of GPU time"] = (round(share * 100), "%")
    evidence["GPU computing per step"] = (round(computing_s * 1e3, 2), "ms")
    evidence["step with bf16 autocast (est.)"] = (round((step - saving) * 1e3, 2), "ms")
    if throughput is not None and throughput.utilization is not None:
        evidence["matrix throughput"] = (round(throughput.tflops, 1), "TFLOP/s")
        evidence["of the device's peak for its precisions"] = (round(throughput.utilization * 100), "%")
    return evidence


FP8_CAPABILITY = 8.9  # fp8 Tensor Cores: Ada (8.9), Hopper (9.0) and later


def _bf16_fix(run: Run, bf16_step: float, capability: float | None) -> str:
    frameworks = run.host.env.frameworks
    where = run.sites.forward_location
    own = precision_option(where.file) if where is not None else None
    if "transformers" in frameworks:
        change = "TrainingArguments(bf16=True)"
    elif "lightning" in frameworks:
        change = 'Trainer(precision="bf16-mixed")'
    elif own is not None:
        change = (f"the script's own setting: `{own.spelling}` (at {own.location.file.rsplit('/', 1)[-1]}:"
                  f"{own.location.line})")
    else:
        change = f"bf16 autocast around the forward and loss ({BF16_LINE})"
    fp8 = ("; past bf16, this GPU's fp8 Tensor Cores (Transformer Engine, torchao's float8 training) where the "
           "model tolerates it, not estimated") if capability is not None and capability >= FP8_CAPABILITY else ""
    return (f"{change} (~{bf16_step * 1e3:.1f} ms/step, est.); it changes the numerics: --try-fixes=all measures the "
            f"step under autocast and how far the loss moves{fp8}")
