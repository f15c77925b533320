"""How the step's matrix throughput reads, on the terminal and the page: 'matrix work: 1.24 TFLOP a step, 93% of it
in TF32, at 54.1 TFLOP/s: 11% of the NVIDIA H200's peak for its precisions'. Formatting only (analysis.throughput)."""

from __future__ import annotations

from gpudoctor.report.document import ThroughputJson

FAR_FROM_PEAK = 0.5  # a utilization under this says where the rest of the GPU's time goes
PRECISION_NAMES = {"fp32": "fp32", "tf32": "TF32", "bf16": "bf16/fp16", "fp8": "fp8"}


def throughput_text(found: ThroughputJson | None) -> str | None:
    """The line, or None for a run without one; where the work was not counted, why."""
    if found is None:
        return None
    if not found["flops"]:
        return f"matrix throughput not measured: {found['reason']}" if found["reason"] else None
    by = found["by_precision"]
    main = max(by, key=lambda p: by[p])
    share = by[main] / found["flops"]
    mix = f"in {PRECISION_NAMES[main]}" if share > 0.995 else f"{share:.0%} of it in {PRECISION_NAMES[main]}"
    text = f"matrix work: {_flop(found['flops'])} a step, {mix}, at {_flop(found['tflops'] * 1e12)}/s"
    if found["utilization"] is None:
        return f"{text} (no utilization: {found['reason']})"
    text = f"{text}: {found['utilization']:.0%} of the {found['device']}'s peak for its precisions"
    other = found.get("other_share")
    if found["utilization"] < FAR_FROM_PEAK and other:
        # a step far from its peak: where the GPU's time goes instead
        text += f"; {other:.0%} of the GPU's kernel time is other work (elementwise, norms, reductions, the optimizer)"
    return text


def _flop(flops: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:.3g} FLOP"
