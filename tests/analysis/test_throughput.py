"""The step's matrix throughput against the device's peak (analysis.throughput): FLOPs by the precision each product
ran in, the model FLOPs utilization on a device the table knows, and why not on one it does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.analysis.throughput import peaks_of, throughput
from gpudoctor.bundle.events import CudaDevice, FlopsEvent
from gpudoctor.bundle.step_events import MatrixWork
from gpudoctor.engine import run_rules
from gpudoctor.report import build_report
from gpudoctor.report.model import link_outputs
from gpudoctor.report.render import to_html, to_text
from gpudoctor.testing import BundleBuilder

TF = 1e12


def counted(*work: tuple[str, str, float], tf32: bool = True) -> FlopsEvent:
    return FlopsEvent(step=12, work=[MatrixWork(kind=k, dtype=d, flops=int(f), calls=1) for k, d, f in work],
                      tf32_matmul=tf32, tf32_conv=True)


def test_the_devices_peak_is_found_by_its_name() -> None:
    assert peaks_of("NVIDIA H100 80GB HBM3")["tf32"] == 494.7
    assert peaks_of("NVIDIA H100 PCIe")["bf16"] == 756.0
    assert peaks_of("NVIDIA A100-SXM4-80GB")["bf16"] == 312.0
    assert peaks_of("NVIDIA L4")["bf16"] == 121.0 and peaks_of("NVIDIA L40S")["bf16"] == 362.0
    assert peaks_of("NVIDIA GeForce GTX 1080") is None and peaks_of(None) is None


def test_utilization_is_the_share_of_the_step_the_work_takes_at_the_peak_of_each_precision() -> None:
    # 10 TFLOP of TF32 products and 1 of fp32 attention in a 100 ms step on an H200
    found = throughput([counted(("gemm", "float32", 10 * TF), ("attention", "float32", 1 * TF))], 0.1, "NVIDIA H200")
    assert found is not None and found.by_precision == {"tf32": 10 * TF, "fp32": 1 * TF}
    assert found.tflops == pytest.approx(110.0)
    at_peak = 10 / 494.7 + 1 / 66.9
    assert found.utilization == pytest.approx(at_peak / 0.1)
    assert found.main_precision == "tf32"
    without_tf32 = throughput([counted(("gemm", "float32", 10 * TF), tf32=False)], 0.1, "NVIDIA H200")
    assert without_tf32 is not None and without_tf32.by_precision == {"fp32": 10 * TF}


def test_an_unknown_device_or_precision_says_why_it_has_no_utilization() -> None:
    unknown = throughput([counted(("gemm", "bfloat16", TF))], 0.1, "Some GPU")
    assert unknown is not None and unknown.utilization is None
    assert unknown.reason == "gpudoctor does not know the peak of Some GPU"
    no_fp8 = throughput([counted(("gemm", "float8_e4m3fn", TF))], 0.1, "NVIDIA A100-SXM4-80GB")
    assert no_fp8 is not None and no_fp8.reason == "the NVIDIA A100-SXM4-80GB has no fp8 peak to set the work against"
    assert throughput([FlopsEvent(reason="compiled")], 0.1, "NVIDIA H200") is None


def test_the_report_gives_the_steps_throughput_and_utilization(tmp_path: Path) -> None:
    b = BundleBuilder(tmp_path)
    b.steps(10, wall_s=0.1, gpu_busy_s=0.09)
    b.env(cuda_device=CudaDevice(name="NVIDIA H200"))
    b.event(counted(("gemm", "bfloat16", 40 * TF), ("attention", "bfloat16", 9.5 * TF)))
    run = b.build()
    report = build_report(run, run_rules(run, []))
    found = report["run"]["throughput"]
    assert found is not None and found["tflops"] == pytest.approx(495.0)
    assert found["utilization"] == pytest.approx(49.5 / 989.4 / 0.1, abs=1e-4)
    assert "matrix work: 49.5 TFLOP a step, in bf16/fp16, at 495 TFLOP/s: 50% of the NVIDIA H200's peak" in (
        to_text(report))
    page = to_html(link_outputs(report, tmp_path))
    assert "<th>Matrix work</th><td colspan=\"3\">49.5 TFLOP a step, in bf16/fp16, at 495 TFLOP/s: 50% of the " in page
