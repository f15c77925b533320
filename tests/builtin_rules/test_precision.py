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


# -- GD315 matmuls-not-in-bf16: the rung after TF32 ---------------------------------------------------------
TF32_GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x256x32_warpgroupsize2x1x1_execute"
FP32_ATTENTION = "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel"


def test_gd315_sizes_the_bf16_rung_of_tf32_products(tmp_path) -> None:
    [finding] = assert_fires("GD315", gemm_run(tmp_path, TF32_GEMM), location="train.py:50")
    # 90% of the step in TF32 GEMMs, 2.67x faster in bf16: 56% of the step, less the 10% the GPU idles
    assert finding["impact"] == pytest.approx(0.9 * (1 - 1 / 2.67) - 0.1, abs=0.01)
    assert finding["remedy"] == {"matmul_precision": "high", "autocast": "bfloat16"}
    assert "torch.autocast" in finding["fix"] and "--try-fixes=all" in finding["fix"]


def test_gd315_counts_fp32_attention_at_its_measured_rate(tmp_path) -> None:
    [finding] = assert_fires("GD315", gemm_run(tmp_path, FP32_ATTENTION))
    assert finding["impact"] == pytest.approx(0.9 * (1 - 1 / 5.9) - 0.1, abs=0.01)
    assert "fp32 attention" in finding["title"]


@pytest.mark.parametrize("kernel", ["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "ampere_sgemm_128x64_tn"])
def test_gd315_is_silent_in_bf16_and_where_tf32s_rung_is_still_open(tmp_path, kernel: str) -> None:
    """bf16 products have no rung left; fp32 ones on CUDA cores are GD311's, whose fix gives the bf16 step too."""
    assert_silent("GD315", gemm_run(tmp_path, kernel))


def test_gd315_on_recorded_runs() -> None:
    [gpt] = assert_fires("GD315", fixture("precision_tf32_gpt_bad"))
    assert gpt["impact"] == pytest.approx(0.56, abs=0.05)  # its bf16 twin measured 56% (46.0 → 20.1 ms)
    for name in ("precision_tf32_gpt_bf16_fixed", "conv_bf16_healthy", "healthy_transformer"):
        assert_silent("GD315", fixture(name))


def test_the_fix_names_the_scripts_own_precision_option(tmp_path) -> None:
    from gpudoctor.analysis import precision_option

    def option_in(name: str, source: str) -> object:
        path = tmp_path / name  # a file of its own each: the parse of a file is kept
        path.write_text(source)
        return precision_option(str(path))

    found = option_in("choices.py", 'import argparse\np = argparse.ArgumentParser()\n'
                      'p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])\n')
    assert found is not None and found.spelling == "--dtype bfloat16" and found.location.line == 3
    assert option_in("switch.py", 'p.add_argument("--bf16", action="store_true")\n').spelling == "--bf16"
    found = option_in("config.py", "batch_size = 12\ndtype = 'float32'  # the configurator overrides it\n")
    assert found is not None and found.spelling == "dtype = 'bfloat16'" and found.location.line == 2
    assert option_in("none.py", 'p.add_argument("--lr", type=float)\n') is None
    script = tmp_path / "train.py"

    b = BundleBuilder(tmp_path / "run")
    b.steps(6, wall_s=0.01, gpu_busy_s=0.009, kernels=4, kernel_name=TF32_GEMM)
    b.forward_site(site=(str(script.with_name("own.py")), 9, "main"))
    script.with_name("own.py").write_text('import argparse\np = argparse.ArgumentParser()\n'
                                          'p.add_argument("--precision", choices=["fp32", "bf16"])\n')
    run = b.build()
    if run.trace is not None:
        run.trace.device_properties = [{"id": 0, "name": "GPU", "computeMajor": 9, "computeMinor": 0}]
    [finding] = assert_fires("GD315", run)
    assert finding["fix"].startswith("the script's own setting: `--precision bf16` (at own.py:3)")


def test_gd315_adds_fp8_as_advice_only_where_the_gpu_has_it(tmp_path) -> None:
    [hopper] = assert_fires("GD315", gemm_run(tmp_path / "hopper", TF32_GEMM, capability=(9, 0)))
    assert "fp8 Tensor Cores" in hopper["fix"] and "not estimated" in hopper["fix"]
    [ampere] = assert_fires("GD315", gemm_run(tmp_path / "ampere", TF32_GEMM, capability=(8, 0)))
    assert "fp8" not in ampere["fix"]
