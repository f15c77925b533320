"""GD311: the precision the step's matrix work runs in."""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor import Finding, NotEvaluated, Remedy, Run, rule
from gpudoctor.analysis import Precision

FP32_KINDS = ("fp32_gemm", "fp32_conv", "fp32_attention")
TF32_LINE = 'torch.set_float32_matmul_precision("high")'
BF16_LINE = 'with torch.autocast("cuda", dtype=torch.bfloat16): loss = ...'


@rule("GD311", "matmuls-without-tensor-cores", category="precision")
def matmuls_without_tensor_cores(run: Run, min_impact: float = 0.1, tf32_speedup: float = 6.0,
                                     bf16_speedup: float = 8.0, bf16_rest_speedup: float = 2.0) -> Iterator[Finding]:
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
    idles the longer), within the budget's GPU-computing slice. The evidence adds the step with bf16 autocast,
    every fp32 matrix kernel made `bf16_speedup` times faster and the rest of the GPU's computing
    `bf16_rest_speedup` times. The factors are measured on precision_fp32_bad and its TF32 and bf16 twins, recorded
    on an H100 (137.6 ms a step against 50.6 and 23.4 ms), against the peak ratios of 7.4x and 14.8x.
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
    rest_s = max(0.0, computing_s - fp32_s)
    bf16_saving = max(0.0, fp32_s * (1 - 1 / bf16_speedup) + rest_s * (1 - 1 / bf16_rest_speedup) - idle_s)
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
