"""What a kernel is, by its name, on names from real runs; and the fp8 rule in both directions."""

from __future__ import annotations

import pytest

from ghsweep.profile.findings import evaluate
from ghsweep.profile.kernel_kinds import function_name, is_fp8_gemm, is_gemm, is_optimizer
from ghsweep.profile.result import ProfileAnalysis

FP8_GEMMS = (
    "nvjet_sm90_qrtst_128x128_128x6_2x1_v_bz_coopA_algo2_TNT",  # torchao float8 on an H200 (backward)
    "nvjet_sm90_qqtst_256x128_128x4_1x2_h_bz_coopA_TNT",  # forward, e4m3 x e4m3
    "sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
    "void cutlass::device_kernel<cutlass3x_sm90_tensorop_gemm_e4m3_e4m3_f32_bf16_bf16_128x128x128_1x1x1_0_tnn>(T1)",
    "void transformer_engine::fp8_gemm_kernel<__nv_fp8_e4m3>(...)",
    "void fbgemm_gpu::f8f8bf16_rowwise_kernel<128, 128>(...)",
)
OTHER_GEMMS = (
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",  # bf16
    "sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel",
    "ampere_sgemm_128x64_tn",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(T1::Params)",
)
NOT_GEMMS = (
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_cga1x1x1_kernel0_0",
    "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>()",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, T2, T3)",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>(T1, T2)",
)


@pytest.mark.parametrize("name", FP8_GEMMS)
def test_fp8_gemms(name):
    assert is_gemm(name) and is_fp8_gemm(name)


@pytest.mark.parametrize("name", OTHER_GEMMS)
def test_other_gemms(name):
    assert is_gemm(name) and not is_fp8_gemm(name)


@pytest.mark.parametrize("name", NOT_GEMMS)
def test_not_gemms(name):
    assert not is_gemm(name) and not is_fp8_gemm(name)


def test_optimizer_and_function_names():
    assert is_optimizer(NOT_GEMMS[3]) and not is_optimizer(OTHER_GEMMS[0])
    assert function_name(NOT_GEMMS[3]) == "multi_tensor_apply_kernel"
    assert (
        function_name("void at::<unnamed>::multi_tensor_apply_kernel<at::<unnamed>::X<4>>(T1)")
        == "multi_tensor_apply_kernel"
    )
    assert function_name(FP8_GEMMS[0]) == FP8_GEMMS[0]


def analysis_with(gemms: dict[str, int]) -> ProfileAnalysis:
    """A minimal analysis of a busy run whose GEMMs took these ns."""
    ranked = [
        {"name": n, "short_name": n, "total_ns": ns, "count": 1, "mean_ns": ns, "pct": 0} for n, ns in gemms.items()
    ]
    from ghsweep.profile.kernel_kinds import gemm_time

    return ProfileAnalysis(
        window={"duration_ns": 10**9, "steps": [1, 2], "basis": "nvtx steps"},
        gpu_busy_pct=99.0,
        gpu_idle_pct=1.0,
        top_kernels=ranked,
        kernels={"total_ns": 10**9, **gemm_time(ranked)},
        gaps={"causes_ns": {}},
    )


def test_fp8_rule_in_both_directions():
    fp8_run = analysis_with({FP8_GEMMS[0]: 400, FP8_GEMMS[1]: 300, OTHER_GEMMS[0]: 100})  # lm_head stays bf16
    bf16_run = analysis_with({OTHER_GEMMS[0]: 700, FP8_GEMMS[0]: 10})
    fired = lambda a: [f for f in evaluate(a, {"precision": "fp8"}) if f.id == "fp8_not_effective"]  # noqa: E731
    assert fired(fp8_run) == []
    (finding,) = fired(bf16_run)
    assert finding.evidence["fp8_gemm_pct"] == pytest.approx(100 * 10 / 710)
    assert not [f for f in evaluate(bf16_run, {"precision": "bf16"}) if f.id == "fp8_not_effective"]


def test_inductor_kernels_line_up_across_runs_without_their_per_graph_index():
    from ghsweep.profile.kernel_kinds import kernel_family

    # The same fused kernel numbered 4 in one run's graph and 2 in another's (seen on 1 vs 2 GPUs).
    assert kernel_family("triton_tem_fused_add_flex_attention_backward_transpose_view_4") == kernel_family(
        "triton_tem_fused_add_flex_attention_backward_transpose_view_2"
    )
    assert kernel_family("triton_poi_fused_add_view_0") == "triton_poi_fused_add_view"
    # Other names keep their digits: they are part of the kernel (a tile shape, an architecture).
    assert (
        kernel_family("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT")
        == "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    )
    assert kernel_family("ampere_sgemm_128x64_nn") == "ampere_sgemm_128x64_nn"
