"""Kernel names on the page: readable, cut at a template boundary, never inside an identifier."""

from __future__ import annotations

import re

import pytest

from gpudoctor.report.kernel_names import MAX_LABEL, kernel_label

GELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
        "at::native::GeluType)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::"
        "{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
        "at::native::GeluType)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::"
        "{lambda(float)#1}, std::array<char*, 2ul>)")
LAYER_NORM = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(int, float, "
              "float const*, float const*, float const*, float*, float*, float*)")
SPLIT_K = ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, float, float, float, "
           "true, false, false>(cublasLt::cublasSplitKParams<float>, float const*, float const*, float*)")
ONE_IDENTIFIER = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"


@pytest.mark.parametrize(("name", "label"), [
    (GELU, "vectorized_elementwise_kernel<4, GeluCUDAKernelImpl, array<char*, 2ul> >"),
    (LAYER_NORM, "vectorized_layer_norm_kernel<float, float, false>"),
    ("triton_poi_fused_add_mul_sigmoid_0", "triton_poi_fused_add_mul_sigmoid_0"),
    (ONE_IDENTIFIER, ONE_IDENTIFIER),  # one identifier: kept whole, however long
])
def test_a_kernel_reads_as_its_name_and_template(name: str, label: str) -> None:
    assert kernel_label(name) == label


def test_a_long_signature_is_cut_at_a_boundary_never_inside_an_identifier() -> None:
    label = kernel_label(SPLIT_K)
    assert label.endswith("…") and len(label) <= MAX_LABEL + 1
    kept = label.removesuffix("…")
    assert SPLIT_K.removeprefix("void ").startswith(kept)
    assert re.match(r"[\s,<>]", SPLIT_K.removeprefix("void ")[len(kept)])  # the next character is a separator
