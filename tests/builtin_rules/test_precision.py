"""GD311 matmuls-without-tensor-cores: the kernels told apart by their names, on the runs recorded on an H100 (fp32
GEMMs on CUDA cores, TF32, bf16) and on bundles built in code."""

from __future__ import annotations

from functools import cache

import pytest

from gpudoctor.analysis import Run
from gpudoctor.analysis.precision import kernel_kind
from gpudoctor.testing import BundleBuilder, assert_fires, assert_not_evaluated, assert_silent, load_fixture


@cache
def fixture(name: str) -> Run:
    return load_fixture(name)


@pytest.mark.parametrize(("name", "kind"), [
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_", "fp32_gemm"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(cutlass_80_simt_sgemm_1", "fp32_gemm"),
    ("void sgemm_largek_lds64<false, false, 6, 3, 4, 5, 2, 64>(float*, float const*", "fp32_gemm"),
    ("fmha_cutlassB_f32_aligned_64x64_k64_dropout_sm80(PyTorchMemEffAttention::AttentionBackward", "fp32_attention"),
    ("sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize128x32x8_stage3", "fp32_conv"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x256x32_warpgroupsize2x1x1_execute", "tf32_gemm"),
    ("sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_", "tf32_conv"),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_s1688wgrad_optimized_tf32_256x64_16x4_nhwc>", "tf32_conv"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "half"),
    ("void gemmSN_TN_kernel<float, 128, 16, 2, 4, 4, 4, true, cublasGemvTensorStridedBatched<float", "other"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl", "other"),
])
def test_kernels_are_told_apart_by_the_math_their_names_carry(name: str, kind: str) -> None:
    assert kernel_kind(name) == kind


def test_fires_on_a_recorded_fp32_language_model_with_both_what_ifs() -> None:
    run = fixture("lm_manual_sgd_bad")  # H100: sm80_xmma ..._ffma and cutlass simt_sgemm kernels
    [finding] = assert_fires("GD311", run, count=1)
    assert finding["category"] == "precision"
    evidence = {row["name"]: row["value"] for row in finding["evidence"]}
    step_ms = run.pace.seconds * 1e3
    assert evidence["fp32 matrix kernels, share of GPU time"] == 75
    assert evidence["device"] == "NVIDIA H100 80GB HBM3 (compute capability 9.0)"
    assert evidence["step with bf16 autocast (est.)"] < evidence["step with TF32 (est.)"] < step_ms
    assert finding["remedy"] == {"matmul_precision": "high"}
    assert 'set_float32_matmul_precision("high")' in finding["fix"] and "torch.autocast" in finding["fix"]
    assert finding["location"]["line"] == 95  # logits = model(inputs)


@pytest.mark.parametrize("name", ["healthy_trainer", "healthy_vision", "healthy_transformer"])
def test_silent_on_recorded_runs_in_tf32_or_bf16(name: str) -> None:
    assert_silent("GD311", fixture(name))


@pytest.mark.parametrize("name", ["small_batch_bad", "tiny_batch_ops_bad", "gil_contention_bad"])
def test_silent_where_the_host_sets_the_pace_whatever_the_kernels_run_in(name: str) -> None:
    """fp32 GEMMs all, but the GPU idles most of the step: faster kernels would only idle it longer."""
    assert_silent("GD311", fixture(name))


def gemm_run(tmp_path, kernel: str, *, capability: tuple[int, int] | None = (9, 0)) -> Run:
    b = BundleBuilder(tmp_path)
    b.steps(6, wall_s=0.01, gpu_busy_s=0.009, kernels=4, kernel_name=kernel)
    b.forward_site(site=("train.py", 50, "main"))
    run = b.build()
    if run.trace is not None:
        run.trace.device_properties = [] if capability is None else [
            {"id": 0, "name": "GPU", "computeMajor": capability[0], "computeMinor": capability[1]}]
    return run


def test_fires_on_a_gpu_bound_step_of_fp32_gemms(tmp_path) -> None:
    [finding] = assert_fires("GD311", gemm_run(tmp_path, "ampere_sgemm_128x64_tn"), location="train.py:50")
    # 90% of the step in fp32 GEMMs, 6x faster in TF32: 75% of the step, less the 10% the GPU idles
    assert finding["impact"] == pytest.approx(0.65, abs=0.02)


def test_silent_before_ampere_where_tf32_and_bf16_have_no_tensor_cores(tmp_path) -> None:
    assert_silent("GD311", gemm_run(tmp_path, "volta_sgemm_128x64_nn", capability=(7, 0)))


def test_not_evaluated_when_the_trace_does_not_give_the_device(tmp_path) -> None:
    assert_not_evaluated("GD311", gemm_run(tmp_path, "volta_sgemm_128x64_nn", capability=None), "compute capability")


def test_silent_when_the_gemms_run_in_tf32(tmp_path) -> None:
    assert_silent("GD311", gemm_run(tmp_path, "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x256x32"))


def test_the_threshold_is_an_option(tmp_path) -> None:
    assert_silent("GD311", gemm_run(tmp_path, "ampere_sgemm_128x64_tn"), options={"min_impact": 0.7})
