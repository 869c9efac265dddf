"""Kernel families: the rules on the kernel names of the real samples, and time per family per iteration."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.analyzers.families import FAMILY_PER_ITERATION, FAMILY_SECONDS, OTHER_NAMES, FamiliesAnalyzer
from aaco.contract.kernels import FAMILIES, families, family_of

from .builders import assert_points_valid, item, iterations, kernels

US = 1000

# Every distinct kernel name in the real captures (examples/data) and the family a performance
# engineer would file it under; a name prefix is enough to pick it out.
SAMPLE_FAMILIES = {
    # A100 AlexNet (Kineto, CUDA 12): cuDNN convolutions, cuBLAS GEMMs, ATen kernels.
    "cudnn_ampere_scudnn_128x64_relu": "convolution",
    "sm80_xmma_fprop_implicit_gemm": "convolution",  # a convolution run as an implicit GEMM
    "void cask_cudnn::computeOffsetsKernel": "convolution",
    "void cudnn::ops::nchwToNhwcKernel": "convolution",
    "void fft2d_c2r_32x32": "convolution",  # cuDNN's FFT convolution
    "void fft2d_r2c_32x32": "convolution",
    "ampere_gcgemm_64x64_nt": "gemm",
    "ampere_sgemm_32x32_sliced1x4_tn": "gemm",
    "void epilogue::impl::globalKernel": "gemm",  # cublasLt epilogue
    "void at::native::(anonymous namespace)::max_pool_forward_nchw": "normalization",
    "void at::native::(anonymous namespace)::adaptive_average_pool": "normalization",
    "void at::native::reduce_kernel": "normalization",
    "void at::native::vectorized_elementwise_kernel": "elementwise",
    "void at::native::elementwise_kernel": "elementwise",
    "void at::native::(anonymous namespace)::fused_dropout_kernel_vec": "elementwise",
    "void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel": "elementwise",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel": "elementwise",  # optimizer step
    # H100 convolution + attention training steps (Kineto, CUDA 13): cuBLAS/cuBLASLt/CUTLASS GEMMs, a cuDNN
    # weight-gradient convolution named "implicit_gemm", cuDNN layout transforms, softmax.
    "sm80_xmma_gemm_f32f32": "gemm",
    "sm80_xmma_wgrad_implicit_gemm": "convolution",  # weight gradient of the convolution, as an implicit GEMM
    "void cudnn::engines_precompiled::nchwToNhwcKernel": "convolution",  # cuDNN's layout transform for its conv
    "void cudnn::engines_precompiled::nhwcToNchwKernel": "convolution",
    "void cublasLt::epilogue::impl::globalKernel": "gemm",
    "void cublasLt::splitKreduce_kernel": "gemm",  # the split-K reduction of a GEMM, not a tensor reduction
    "void cutlass::Kernel2<cutlass_80_simt_sgemm": "gemm",
    "void gemmSN_NN_kernel": "gemm",
    "void gemmSN_TN_kernel": "gemm",
    "void scal_kernel": "gemm",  # cuBLAS scal (the beta scaling of a GEMM)
    "void sgemm_largek_lds64": "gemm",
    "void (anonymous namespace)::softmax_warp_": "normalization",
    # MI250 mini training (Kineto, ROCm 6.2): Tensile GEMMs.
    "Cijk_A": "gemm",
    "elementwise_kernel": "elementwise",
    # rocprofv3 / rocprof v1 (HIP samples).
    "divide_kernel": "elementwise",
    "multiply_kernel": "elementwise",
    "subtract_kernel": "elementwise",
    "void addition_kernel": "elementwise",
}


def _sample_names(samples: Path) -> Counter[tuple[str, str]]:
    names: Counter[tuple[str, str]] = Counter()
    for sub in ("kineto", "kineto-h100", "rocprofv3", "rocprof-v1"):
        for path in sorted((samples / sub).iterdir()):
            tf = identify(path)
            if tf.format is None:
                continue
            for parsed in parse_any(tf, context_for(tf, node="n", source="s")):
                cols = parsed.kernels.select(["name", "kind"]).to_pydict()
                names.update(zip(cols["name"], cols["kind"], strict=True))
    return names


def test_every_kernel_name_in_the_real_samples_has_its_family(samples):
    names = _sample_names(samples)
    kernel_names = {n for n, k in names if k == "kernel"}
    assert len(kernel_names) >= 25
    unexplained = []
    for name in sorted(kernel_names):
        expected = [fam for prefix, fam in SAMPLE_FAMILIES.items() if name.startswith(prefix)]
        assert expected, f"no expectation for sample kernel {name[:100]!r}: add it to SAMPLE_FAMILIES"
        if family_of(name) != expected[0]:
            unexplained.append((name[:100], family_of(name), expected[0]))
    assert not unexplained
    # Copies and memsets are known from their kind, whatever their name.
    for name, kind in names:
        if kind in ("memcpy", "memset"):
            assert family_of(name, kind) == kind


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "communication"),
        ("rcclKernel_AllGather", "communication"),
        ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64>>", "attention"),
        ("fmha_cutlassF_f16_aligned_64x64_rf_sm80", "attention"),
        ("Cijk_Alik_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1", "gemm"),
        ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x128_16x3_tt_align4>", "gemm"),
        ("hipblasltKernel_MT64x64", "gemm"),
        ("miopenSp3AsmConv_v21_1_3_gfx9_fp32_stride1", "convolution"),
        ("MIOpenBatchNormFwdTrainSpatial", "normalization"),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", "normalization"),
        ("void at::native::softmax_warp_forward<float, float, float, 10, false>", "normalization"),
        ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>", "elementwise"),
        ("some_custom_kernel", "other"),
        ("", "other"),
        (None, "other"),
    ],
)
def test_rules_on_library_names(name, family):
    assert family_of(name) == family


def test_vectorised_families_match_one_by_one():
    names = pa.array(["Cijk_x", "flash_fwd", None, "Cijk_x", "memcpy", "x"])
    kinds = pa.array(["kernel", "kernel", "kernel", "kernel", "memcpy", "memset"])
    assert list(families(names, kinds)) == ["gemm", "attention", "other", "gemm", "memcpy", "memset"]
    assert set(FAMILIES) >= {"gemm", "convolution", "attention", "normalization", "elementwise", "communication"}


def _kern(specs, model="m", node="node-a"):
    """Kernels back to back from (name, duration_us, kind) specs."""
    starts, ends, names, kinds, t = [], [], [], [], 0
    for name, dur_us, kind in specs:
        starts.append(t)
        ends.append(t + dur_us * US)
        names.append(name)
        kinds.append(kind)
        t += (dur_us + 5) * US
    n = len(starts)
    return item(
        "kernels", kernels(starts, ends, name=names, kind=kinds, model=[model] * n, node=[node] * n, run_id=["r"] * n)
    )


def test_time_per_family_per_iteration():
    a = FamiliesAnalyzer()
    a.update(item("iterations", iterations([(0, 10_000_000), (10_000_000, 20_000_000)], model="m")))
    # Two iterations' worth: 2 GEMMs of 300 us, 4 elementwise of 25 us, one 100 us copy.
    a.update(_kern([("Cijk_gemm", 300, "kernel"), ("add_kernel_elementwise", 25, "kernel")] * 2))
    a.update(_kern([("add_kernel_elementwise", 25, "kernel")] * 2 + [("HtoD", 100, "memcpy")]))
    r = a.snapshot().to_dict()["models"]["m"]
    assert r["iterations"] == 2
    fams = r["families"]
    assert set(fams) == {"gemm", "elementwise", "memcpy"}
    assert fams["gemm"]["time_s"] == pytest.approx(600e-6)
    assert fams["gemm"]["per_iteration_s"] == pytest.approx(300e-6)
    assert fams["gemm"]["kernels_per_iteration"] == 1
    assert fams["elementwise"]["per_iteration_s"] == pytest.approx(50e-6)
    assert fams["memcpy"]["kernels"] == 1
    assert fams["gemm"]["share"] == pytest.approx(600 / 800)
    assert sum(f["share"] for f in fams.values()) == pytest.approx(1.0)
    assert [k["name"] for k in r["top_kernels"]] == ["Cijk_gemm", "add_kernel_elementwise", "HtoD"]
    assert r["top_kernels"][1]["mean_us"] == pytest.approx(25)


def test_points_and_models_without_iterations():
    a = FamiliesAnalyzer()
    a.update(_kern([("Cijk_gemm", 10, "kernel")], model=None))
    res = a.snapshot()
    g = res.to_dict()["models"]["unknown"]
    assert g["families"]["gemm"]["per_iteration_s"] is None
    pts = res.points()
    assert_points_valid(pts)
    assert {p.metric.prom_name for p in pts} == {FAMILY_SECONDS.prom_name}
    a.update(item("iterations", iterations([(0, 1000)], model="m2")))
    a.update(_kern([("Cijk_gemm", 10, "kernel")], model="m2"))
    names = {p.metric.prom_name for p in a.snapshot().points()}
    assert names == {FAMILY_SECONDS.prom_name, FAMILY_PER_ITERATION.prom_name}


def test_bounded_names_and_models():
    a = FamiliesAnalyzer(max_models=2, max_names=3)
    a.update(_kern([(f"k{i}", 10, "kernel") for i in range(6)]))
    g = a.snapshot().to_dict()["models"]["m"]
    names = {k["name"] for k in g["top_kernels"]}
    assert OTHER_NAMES in names and len(names) == 4
    assert g["names_dropped"] == 3
    assert g["time_s"] == pytest.approx(60e-6)  # nothing lost: the overflow keeps its time
    for model in ("m2", "m3", "m4"):
        a.update(_kern([("k", 1, "kernel")], model=model))
    assert len(a.snapshot().groups) == 2
    assert a.groups_dropped == 2


def test_snapshot_is_immutable():
    a = FamiliesAnalyzer()
    a.update(_kern([("Cijk_gemm", 10, "kernel")]))
    snap = a.snapshot()
    before = snap.to_dict()
    a.update(_kern([("Cijk_gemm", 10, "kernel")]))
    assert snap.to_dict() == before
