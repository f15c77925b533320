"""The step's matrix throughput against the device's peak: the FLOPs of one step's matrix products, convolutions and
attention (counted in the script's process: collect.flops), over the step at the run's pace, and the share of the
step they would take at the device's dense peak for the precision each ran in: the model FLOPs utilization.

    utilization = Σ_p  FLOPs_p / peak_p  /  step

over the precisions p the products ran in (an fp32 product runs in TF32 where the script allows it: torch's
`allow_tf32` for matmuls and for cuDNN). 100% would be every product at the peak and nothing else in the step.
The peaks are NVIDIA's data-sheet figures, dense (no sparsity), per GPU model; a device not in the table has no
utilization, and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.bundle.step_events import FlopsEvent, MatrixWork

PRECISIONS = ("fp32", "tf32", "bf16", "fp8")
# Dense TFLOP/s by precision (bf16 stands for fp16 too), from NVIDIA's data sheets. A name is matched by the first
# entry whose every word is in the device's name, in this order (H100 PCIe before H100).
PEAK_TFLOPS: tuple[tuple[tuple[str, ...], dict[str, float]], ...] = (
    (("GH200",), {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp8": 1978.9}),
    (("H200",), {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp8": 1978.9}),
    (("H100", "PCIe"), {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp8": 1513.0}),
    (("H100", "NVL"), {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp8": 1670.5}),
    (("H100",), {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp8": 1978.9}),
    (("B200",), {"fp32": 80.0, "tf32": 1100.0, "bf16": 2250.0, "fp8": 4500.0}),
    (("A100",), {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0}),
    (("L40S",), {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp8": 733.0}),
    (("L4",), {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp8": 242.0}),
    (("A10G",), {"fp32": 31.2, "tf32": 35.0, "bf16": 70.0}),
    (("A10",), {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0}),
    (("V100",), {"fp32": 15.7, "bf16": 125.0}),  # fp16 on its Tensor Cores; no TF32, no bf16
)
NOT_COUNTED = "the step's matrix work was not counted"


@dataclass(frozen=True)
class Throughput:
    """One step's matrix work (`flops`, by precision in `by_precision`) at the run's pace (`step_s`): its
    throughput, and, on a device the table knows, the share of the step that work would take at the peak."""

    flops: float
    by_precision: dict[str, float]
    step_s: float
    device: str | None
    peaks: dict[str, float] | None  # TFLOP/s by precision, for `device`
    utilization: float | None
    reason: str | None  # why there is no utilization

    @property
    def tflops(self) -> float:
        """What the step achieves, in TFLOP/s."""
        return self.flops / self.step_s / 1e12 if self.step_s > 0 else 0.0

    @property
    def main_precision(self) -> str | None:
        """The precision most of the work ran in."""
        return max(self.by_precision, key=lambda p: self.by_precision[p]) if self.by_precision else None


def precision_of(work: MatrixWork, tf32_matmul: bool | None, tf32_conv: bool | None) -> str:
    """fp32, tf32, bf16 (fp16 too) or fp8: what the product's math runs in."""
    dtype = work.dtype
    if dtype.startswith("float8"):
        return "fp8"
    if dtype in ("bfloat16", "float16"):
        return "bf16"
    allowed = tf32_conv if work.kind == "conv" else tf32_matmul if work.kind == "gemm" else False
    return "tf32" if allowed else "fp32"


def peaks_of(device: str | None) -> dict[str, float] | None:
    """The device's dense peaks by precision; None for a device the table does not know."""
    if not device:
        return None
    words = device.replace("-", " ").split()
    return next((peaks for names, peaks in PEAK_TFLOPS if all(name in words for name in names)), None)


def throughput(events: Sequence[FlopsEvent], step_s: float | None, device: str | None) -> Throughput | None:
    """The step's matrix throughput from its counted step (the first FlopsEvent with a count); None where no step
    was counted or the run has no pace."""
    counted = next((e for e in events if e.reason is None and e.work), None)
    if counted is None or not step_s:
        return None
    by_precision: dict[str, float] = {}
    for work in counted.work:
        if work.dtype in ("float64", "int8", "unknown"):
            continue  # no Tensor-Core peak to set them against
        key = precision_of(work, counted.tf32_matmul, counted.tf32_conv)
        by_precision[key] = by_precision.get(key, 0.0) + work.flops
    flops = sum(by_precision.values())
    if flops <= 0:
        return None
    peaks = peaks_of(device)
    if peaks is None:
        return Throughput(flops, by_precision, step_s, device, None, None,
                          f"gpudoctor does not know the peak of {device or 'this device'}")
    missing = [p for p in by_precision if p not in peaks]
    if missing:
        return Throughput(flops, by_precision, step_s, device, peaks, None,
                          f"the {device} has no {missing[0]} peak to set the work against")
    at_peak_s = sum(f / (peaks[p] * 1e12) for p, f in by_precision.items())
    return Throughput(flops, by_precision, step_s, device, peaks, min(1.0, at_peak_s / step_s), None)


def why_not_counted(events: Sequence[FlopsEvent]) -> str:
    """Why a run has no throughput: the counter's own reason, or that no step was counted."""
    reason = next((e.reason for e in events if e.reason), None)
    return f"{NOT_COUNTED}: {reason}" if reason else NOT_COUNTED
