"""The precision the GPU's matrix work runs in: its GEMM and convolution kernels told apart by their names, and how
much of the step runs in fp32 on CUDA cores on a GPU whose Tensor Cores would run it in TF32 or bf16.

The profiler names each kernel as cuBLAS, cuDNN, CUTLASS and PyTorch built it, and the names carry the math:
`sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma` and `cutlass_80_simt_sgemm_*` multiply fp32 on CUDA cores (FFMA),
`sm90_xmma_gemm_f32f32_tf32f32_...` and `cutlass_80_tensorop_s1688gemm_*` run TF32 on the Tensor Cores,
`nvjet_sm90_..._h_...`, `*bf16*` and `*s16816gemm*` half precision. Names the patterns do not know are "other":
never counted as fp32. The device's compute capability comes from the trace's `deviceProperties`: TF32 and bf16
need 8.0 or later.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from gpudoctor.analysis.gpu_ops import GpuOps
from gpudoctor.analysis.trace import TraceData

# fp32 math on CUDA cores: cuBLAS's SIMT GEMMs, CUTLASS's simt_sgemm, the small-matrix kernels cuBLAS picks for
# fp32 (gemmSN, gemmk1), xmma kernels whose math is f32 with FFMA. A matrix-vector kernel (cuBLAS's gemv, which
# gemmSN also serves) is bound by memory, not by its math: it is "other".
FP32_MATMUL = re.compile(r"sgemm|f32f32_f32f32|gemmSN_\w*kernel<float|gemmk1_kernel<\w*float", re.IGNORECASE)
# Attention in fp32: the memory-efficient kernels run it on CUDA cores whatever TF32 allows; bf16 moves it to a
# half-precision kernel (flash attention where it applies).
FP32_ATTENTION = re.compile(r"fmha_cutlass[FB]_f32", re.IGNORECASE)
# Convolutions, which cuDNN runs: its implicit-GEMM kernels name their pass (fprop, dgrad, wgrad) or `convolve`.
CONVOLUTION = re.compile(r"fprop|dgrad|wgrad|convolve|conv2d|winograd", re.IGNORECASE)
MEMORY_BOUND = re.compile(r"gemv", re.IGNORECASE)
# TF32 on the Tensor Cores: cuBLAS/cuDNN xmma kernels with tf32 in their math, CUTLASS tensorop s1688 (TF32 in, fp32
# accumulate).
TF32_MATMUL = re.compile(r"tf32|tensorop_s1688|s1688gemm|s1688wgrad|s1688fprop|s1688dgrad", re.IGNORECASE)
# Half precision (fp16, bf16, fp8) matrix kernels: cuBLAS's nvjet with an h/b element type, hgemm, s16816 (fp16
# in, fp32 accumulate), bf16/f16 in a kernel's math, flash attention.
HALF_MATMUL = re.compile(
    r"nvjet_\w*_[hbe]_|hgemm|h1688|h16816|s16816|bf16|f16f16|_f16_|e4m3|e5m2|flash_fwd|flash_bwd"
    r"|fmha_cutlass[FB]_(?:bf)?16", re.IGNORECASE)
TENSOR_CORE_CAPABILITY = 8.0  # TF32 and bf16 on the Tensor Cores: Ampere (8.0) and later
# What a kernel's matrix math runs in: fp32 on CUDA cores (a GEMM, a convolution, attention), TF32 (a GEMM, or a
# convolution), half precision, or other work (elementwise, reductions, copies, matrix-vector products).
KINDS = ("fp32_gemm", "fp32_conv", "fp32_attention", "tf32_gemm", "tf32_conv", "half", "other")
FP32_KINDS = ("fp32_gemm", "fp32_conv", "fp32_attention")


@dataclass(frozen=True)
class MatmulKernel:
    """One kernel, by name, over the analysed steps: its kind (KINDS) and its GPU seconds."""

    name: str
    kind: str
    seconds: float


@dataclass(frozen=True)
class Precision:
    """The analysed steps' kernels by the precision their matrix math runs in (`seconds`, by KINDS: fp32 GEMMs,
    convolutions and attention on CUDA cores, TF32 ones, half precision, other work), over `steps` steps, on a
    device of compute capability `capability` (None: the trace does not say); `top_fp32` the fp32 matrix kernels
    that took the most time, most first."""

    seconds: dict[str, float]
    steps: int
    capability: float | None
    device: str | None
    top_fp32: tuple[MatmulKernel, ...]

    @property
    def kernel_s(self) -> float:
        """Every kernel's GPU seconds, over the analysed steps."""
        return sum(self.seconds.values())

    def per_step_s(self, kind: str) -> float:
        return self.seconds.get(kind, 0.0) / self.steps if self.steps else 0.0

    def share(self, *kinds: str) -> float:
        """The share of the kernels' time in the given kinds."""
        return sum(self.seconds.get(k, 0.0) for k in kinds) / self.kernel_s if self.kernel_s > 0 else 0.0

    @property
    def tf32_reaches(self) -> tuple[str, ...]:
        """The fp32 kinds that turning TF32 on would move to the Tensor Cores: GEMMs unless some already run in TF32
        (matmul TF32 is on), convolutions unless some already do (cuDNN's TF32 is on by default: the fp32 ones
        left are those cuDNN chose not to run so)."""
        return tuple(f"fp32_{op}" for op in ("gemm", "conv") if not self.seconds.get(f"tf32_{op}"))

    @property
    def tensor_cores(self) -> bool | None:
        """Whether the device runs TF32 and bf16 on Tensor Cores; None when the trace does not say."""
        return None if self.capability is None else self.capability >= TENSOR_CORE_CAPABILITY


def kernel_kind(name: str) -> str:
    """One of KINDS: the precision a kernel's matrix math runs in, by its name."""
    conv = "conv" if CONVOLUTION.search(name) else "gemm"
    if TF32_MATMUL.search(name):
        return f"tf32_{conv}"
    if HALF_MATMUL.search(name):
        return "half"
    if MEMORY_BOUND.search(name):
        return "other"
    if FP32_ATTENTION.search(name):
        return "fp32_attention"
    if FP32_MATMUL.search(name):
        return f"fp32_{conv}"
    return "other"


def precision(kernels: GpuOps, steps: int, trace: TraceData | None, device: int | None) -> Precision:
    """The kernels of `steps` analysed steps by precision, on `device` (the one the steps train on)."""
    names, kinds = kernels.columns.names, dict[int, str]()
    seconds: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    for name_id, dur in zip(kernels.name_ids(), kernels.durations()):
        name = names[name_id]
        kind = kinds.get(name_id)
        if kind is None:
            kind = kinds[name_id] = kernel_kind(name)
        seconds[kind] += dur
        if kind.startswith("fp32"):
            by_name[name] += dur
    top = sorted(by_name.items(), key=lambda item: -item[1])[:3]
    capability, device_name = _capability(trace, device)
    return Precision(dict(seconds), steps, capability, device_name,
                     tuple(MatmulKernel(name, kernel_kind(name), s) for name, s in top))


def _capability(trace: TraceData | None, device: int | None) -> tuple[float | None, str | None]:
    """The compute capability (9.0) and name of `device`, from the trace's deviceProperties."""
    for props in trace.device_properties if trace is not None else []:
        if device is not None and props.get("id") != device:
            continue
        major, minor = props.get("computeMajor"), props.get("computeMinor")
        if type(major) is int and type(minor) is int:
            name = props.get("name")
            return major + minor / 10, name if isinstance(name, str) else None
    return None, None
