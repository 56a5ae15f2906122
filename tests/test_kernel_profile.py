"""The kernel classes of ``ditfuse bench --e2e --kernels``: names of the kernels a step runs
(cuDNN / FlashAttention / ditfuse attention, cuBLAS / cuBLASLt GEMMs, everything else)."""

from __future__ import annotations

import pytest
import torch

from ditfuse.tools import kernel_profile as kp

# names as torch.profiler reports them (cuDNN 9's SDPA, PyTorch's FlashAttention and
# memory-efficient kernels, cuBLAS's nvjet / xmma / CUTLASS GEMMs)
ATTENTION = [
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128_4x1x1_kernel0_0",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f8_knob_7_64x128x128_4x1x1_kernel0_0",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, false>"
    "(Flash_fwd_params)",
    "fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>)",
]
GEMM = [
    "nvjet_tst_192x192_64x4_2x1_v_bz_coopA_TNT",
    "nvjet_sm90_qqtst_128x256_128x6_2x1_2cta_v_bz_Avec32UE8M0_TNT",
    "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_"
    "segment_k_off_kernel__5x_cublas",
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>"
    "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)",
    "void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true>()",
]
OTHER = [
    "triton_poi_fused_add_addcmul_mul_native_layer_norm_0",
    "triton_red_fused__to_copy_abs_amax_clamp_div_mul_reciprocal_1",
    "Memcpy DtoD (Device -> Device)",
    "Memset (Device)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>()",
]


def _ditfuse_kernels() -> dict[str, str]:
    """Every ``*_kernel`` function of ``ditfuse.kernels``'s modules: name -> module."""
    import importlib
    import pkgutil

    import ditfuse.kernels as pkg

    found = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        for name in vars(mod):
            if name.endswith("_kernel") and not name.startswith("__"):
                found[name] = mod.__name__
    return found


#: ditfuse's attention kernels (the 16-bit and differential sliding-window ones, the 8-bit
#: Triton and warp-specialized ones)
DITFUSE_ATTENTION = {
    "_swa_fwd_kernel",
    "_swa_diff_sm90_kernel",
    "_attention_8bit_kernel",
    "_attention_8bit_ws_kernel",
}
#: ditfuse's GEMM (the FP8 linears' on sm_90)
DITFUSE_GEMM = {"_gemm_fp8_rows_kernel"}


@pytest.mark.parametrize("name", ATTENTION)
def test_attention_kernels(name):
    assert kp.kernel_class(name) == "attention"


@pytest.mark.parametrize("name", GEMM)
def test_gemm_kernels(name):
    assert kp.kernel_class(name) == "GEMM"


@pytest.mark.parametrize("name", OTHER)
def test_other_kernels(name):
    assert kp.kernel_class(name) == "other"


def test_ditfuse_kernels_classes():
    """ditfuse's attention kernels are attention, its FP8 GEMM a GEMM; every other kernel of
    the package (the attention's input quantizers, the row quantizer, AdaLN, GroupNorm, ...)
    is neither."""
    kernels = _ditfuse_kernels()
    assert DITFUSE_ATTENTION | DITFUSE_GEMM <= set(kernels), sorted(kernels)
    assert {"_quantize_rows_kernel", "_qk_quant_kernel", "_adaln_fp8_tile_kernel"} <= set(kernels)
    got = {n: kp.kernel_class(n) for n in kernels}
    want = {
        n: "attention" if n in DITFUSE_ATTENTION else "GEMM" if n in DITFUSE_GEMM else "other"
        for n in kernels
    }
    assert got == want


def test_time_by_class_sums_ms_and_formats():
    kernels = [(ATTENTION[0], 2500.0), (GEMM[0], 1000.0), (GEMM[2], 250.0), (OTHER[0], 125.0)]
    split = kp.time_by_class(kernels)
    assert list(split) == ["attention", "GEMM", "other"]
    assert split == {"attention": 2.5, "GEMM": 1.25, "other": 0.125}
    assert kp.format_split(split) == (
        "kernels of a call: attention 2.50, GEMM 1.25, other 0.12 ms (3.88)"
    )
    assert kp.time_by_class([]) == {"attention": 0.0, "GEMM": 0.0, "other": 0.0}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_profiled_kernels_of_a_gemm_and_an_add():
    """On a GPU: one bf16 matmul and one add give a GEMM and an other kernel, with times."""
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)

    def fn():
        return (a @ b) + a

    fn()
    kernels = kp.profiled_kernels(fn)
    split = kp.time_by_class(kernels)
    assert split["GEMM"] > 0 and split["other"] > 0, kernels
    assert split["attention"] == 0, kernels
