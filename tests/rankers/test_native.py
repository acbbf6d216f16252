"""aheadrank/kernels/native.py: the optional compiled kernels — built once per machine, equal to the PyTorch stages,
and never required (switched off, no compiler, a failed build: the PyTorch code runs)."""

from __future__ import annotations

import ctypes
import logging
import os
import shutil

import pytest
import torch
from aheadrank.rankers import tk
from test_init_and_math import _adversarial_matches

from aheadrank.kernels import attention, native
from aheadrank.kernels import tk as tk_kernels

# the loader's own tests need every family on (the suite run with AHEADRANK_NATIVE=none skips them) ...
families_on = pytest.mark.skipif(
    native.families() != frozenset(native.FAMILIES), reason="kernel families off (AHEADRANK_NATIVE)"
)
# ... and the kernels' a compiler
needs_cc = pytest.mark.skipif(
    native._compiler() is None or native.families() != frozenset(native.FAMILIES),
    reason="no C compiler, or kernel families off (AHEADRANK_NATIVE)",
)
MU = tk.KERNEL_MU


@pytest.fixture
def fresh_native(monkeypatch, tmp_path):
    """native's loader with an empty cache of its own; the process-wide loader is restored afterwards."""
    monkeypatch.setenv("AHEADRANK_NATIVE_CACHE", str(tmp_path / "native"))
    native._load.cache_clear()
    yield tmp_path / "native"
    native._load.cache_clear()


def _sums_reference(match: torch.Tensor, d_mask: torch.Tensor) -> torch.Tensor:
    """Σ_j K [B, Tq, K] in float64, straight from the formula."""
    mu = torch.tensor(MU, dtype=torch.float64)
    k = torch.exp(-((match.double()[..., None] - mu) ** 2) / (2 * tk.KERNEL_SIGMA**2))
    return (k * d_mask[:, None, :, None]).sum(2)


@needs_cc
@pytest.mark.parametrize(
    ("b", "tq", "td"), [(40, 18, 33), (7, 5, 300), (9, 1, 17), (5, 64, 12), (3, 16, 128)]
)
def test_native_sums_equal_the_formula(b, tq, td):
    """Per (document, query term, kernel), the compiled stage's Σ_j K within 1e-4 of the float64 formula,
    relative to that kernel's largest sum (scores are linear in the features), with garbage in the padding,
    padding inside a document too, documents of every length down to 0 and query-term counts that are no
    multiple of the vector width."""
    match, _, d_mask = _adversarial_matches(b, tq, td)
    d_mask[:, ::5] = False  # holes inside documents, not only trailing padding
    match[~d_mask[:, None, :].expand_as(match)] = 5.0
    with torch.inference_mode():
        got = tk_kernels.native_sums(match, d_mask, MU, tk.KERNEL_SIGMA)
    assert got is not None and got.shape == (b, tq, len(MU)) and got.dtype == torch.float32
    want = _sums_reference(match, d_mask)
    scale = want.abs().amax((0, 1)).clamp(min=1e-6)
    assert ((got.double() - want).abs() / scale).max().item() <= 1e-4
    # the 1e-30 floor per value is all that separates padding from an exact 0
    empty = d_mask.sum(1) == 0
    if empty.any():
        assert got[empty].max().item() < 1e-20


@needs_cc
def test_kernel_features_native_equal_the_pytorch_stage(monkeypatch):
    """The features TK scores with are the same whether the compiled stage or the PyTorch chain computes
    them, for the transposed-storage view ``cosines`` hands over."""
    match, q_mask, d_mask = _adversarial_matches(60, 12, 70)
    view = match.transpose(1, 2).contiguous().transpose(1, 2)
    mu = torch.tensor(MU)
    with torch.inference_mode():
        fast = tk.kernel_features(view, q_mask, d_mask, mu, tk.KERNEL_SIGMA)
        monkeypatch.setenv("AHEADRANK_NATIVE", "0")
        assert tk_kernels.native_sums(view, d_mask, MU, tk.KERNEL_SIGMA) is None
        slow = tk.kernel_features(view, q_mask, d_mask, mu, tk.KERNEL_SIGMA)
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@needs_cc
def test_library_is_built_once_per_machine_and_reused(fresh_native):
    lib = native.library()
    assert lib is not None
    (built,) = fresh_native.glob("kernels-*.so")
    stamp = built.stat().st_mtime_ns
    native._load.cache_clear()  # a new process: finds the build, does not compile again
    assert native.library() is not None
    assert [p.name for p in fresh_native.iterdir()] == [built.name]  # no temporary file left behind
    assert built.stat().st_mtime_ns == stamp


@families_on
@pytest.mark.parametrize("cc", ["/nonexistent/cc", "false"])
def test_no_compiler_or_a_failed_build_falls_back(fresh_native, monkeypatch, caplog, cc):
    """Without a working compiler the loader says so once and returns None; TK's features still come out,
    from the PyTorch stage."""
    if cc == "false" and shutil.which("false") is None:
        pytest.skip("no `false` command")
    monkeypatch.setenv("CC", cc)
    if cc.startswith("/nonexistent"):
        monkeypatch.setattr(shutil, "which", lambda name: None)
    with caplog.at_level(logging.WARNING, logger="aheadrank.native"):
        assert native.library() is None
        assert native.library() is None
    assert len([r for r in caplog.records if r.name == "aheadrank.native"]) == 1
    assert not list(fresh_native.glob("*.so")) if fresh_native.exists() else True
    match, q_mask, d_mask = _adversarial_matches(10, 6, 20)
    with torch.inference_mode():
        assert tk_kernels.native_sums(match, d_mask, MU, tk.KERNEL_SIGMA) is None
        feats = tk.kernel_features(match, q_mask, d_mask, torch.tensor(MU), tk.KERNEL_SIGMA)
    assert all(torch.isfinite(f).all() for f in feats)


def test_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv("AHEADRANK_NATIVE", "0")
    assert not native.enabled() and native.library() is None
    monkeypatch.setenv("AHEADRANK_NATIVE", "1")
    assert native.enabled()


def test_families_switched_one_by_one(monkeypatch):
    """``AHEADRANK_NATIVE`` names the families that run (or those left out of all); each kernel's caller asks for
    its own family, so one switched off runs its PyTorch code while the others stay on; an unknown name is an
    error, not a silent fallback."""
    every = set(native.FAMILIES)
    for value, on in (
        ("all", every),
        ("", every),
        ("none", set()),
        ("off", set()),
        ("attention, tk", {"attention", "tk"}),
        ("-layer,-tk", every - {"layer", "tk"}),
    ):
        monkeypatch.setenv("AHEADRANK_NATIVE", value)
        assert native.families() == on, value
        assert all(native.enabled(f) is (f in on) for f in native.FAMILIES)
    monkeypatch.setenv("AHEADRANK_NATIVE", "tk")
    assert native.library("attention") is None
    for bad in ("attention,gemm", "tk,-layer"):
        monkeypatch.setenv("AHEADRANK_NATIVE", bad)
        with pytest.raises(ValueError, match="AHEADRANK_NATIVE"):
            native.enabled("tk")
    with pytest.raises(ValueError, match="unknown kernel family"):
        native.enabled("gemm")


def test_a_family_switched_off_takes_the_pytorch_path(monkeypatch):
    """With the attention family off (the others on), the attention kernel declines and the attention runs in
    PyTorch with the same values; with it on, the compiled kernel answers (where this build has it)."""
    torch.manual_seed(0)
    q = torch.randn(1, 2, 3, 32)
    k, v = torch.randn(4, 9, 64), torch.randn(4, 9, 64)
    monkeypatch.setenv("AHEADRANK_NATIVE", "-attention")
    with torch.inference_mode():
        assert attention.native(q, k, v, None, 32**-0.5) is None
        monkeypatch.setenv("AHEADRANK_NATIVE", "attention")
        found = attention.native(q, k, v, None, 32**-0.5)
    if found is None:
        pytest.skip("this build has no compiled attention (no compiler or no AVX-512)")
    kh, vh = (x.view(4, 9, 2, 32).transpose(1, 2) for x in (k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q.expand(4, -1, -1, -1), kh, vh)
    torch.testing.assert_close(found[0], ref.transpose(1, 2).reshape(4, 3, 64), atol=1e-5, rtol=1e-5)


@needs_cc
def test_outside_the_kernels_limits_the_pytorch_stage_runs():
    """More query terms than the compiled stage takes, float64, or gradients: None from the compiled stage,
    and kernel_features still equals the formula."""
    match, q_mask, d_mask = _adversarial_matches(4, native.MAX_QUERY_TERMS + 1, 10)
    assert tk_kernels.native_sums(match, d_mask, MU, tk.KERNEL_SIGMA) is None
    assert tk_kernels.native_sums(match.double(), d_mask, MU, tk.KERNEL_SIGMA) is None
    mu = torch.tensor(MU)
    with torch.inference_mode():
        got = tk.kernel_features(match, q_mask, d_mask, mu, tk.KERNEL_SIGMA)
    want = tk.kernel_features_reference(match.double(), q_mask, d_mask, mu.double(), tk.KERNEL_SIGMA)
    for a, b in zip(got, want, strict=True):
        scale = b.abs().amax(0).clamp(min=1e-6)
        assert ((a.double() - b).abs() / scale).max().item() <= 1e-4


def _openmp_runtime_of(lib: ctypes.CDLL) -> str:
    """The file of the OpenMP runtime that ``lib`` calls (dlsym through its handle searches its dependencies)."""

    class DlInfo(ctypes.Structure):
        _fields_ = [
            ("dli_fname", ctypes.c_char_p),
            ("dli_fbase", ctypes.c_void_p),
            ("dli_sname", ctypes.c_char_p),
            ("dli_saddr", ctypes.c_void_p),
        ]

    info = DlInfo()
    address = ctypes.cast(lib.omp_get_max_threads, ctypes.c_void_p).value
    assert ctypes.CDLL(None).dladdr(ctypes.c_void_p(address), ctypes.byref(info)), "dladdr found nothing"
    return os.path.realpath(info.dli_fname.decode())


@needs_cc
def test_kernels_run_on_pytorchs_openmp_runtime():
    """The library's OpenMP runtime is the one PyTorch loaded (the kernels' threads are PyTorch's own; another
    package's libgomp under another soname, scikit-learn's say, may share the process), and the thread count
    changes nothing but the speed."""
    assert native.library() is not None
    torch_cpu = next(line.split()[-1] for line in open("/proc/self/maps") if "libtorch_cpu" in line)
    assert _openmp_runtime_of(native.library()) == _openmp_runtime_of(ctypes.CDLL(torch_cpu))
    match, _, d_mask = _adversarial_matches(23, 7, 40)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = tk_kernels.native_sums(match, d_mask, MU, tk.KERNEL_SIGMA)
        torch.set_num_threads(3)
        three = tk_kernels.native_sums(match, d_mask, MU, tk.KERNEL_SIGMA)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, three)


@pytest.mark.parametrize(("b", "tq", "td"), [(3, 0, 5), (0, 4, 5), (2, 4, 0)])
def test_empty_queries_and_batches_take_the_pytorch_stage(b, tq, td):
    """A query that tokenises to nothing (the service can be sent one), no candidates or no document terms:
    the compiled stage declines (it divides by the query length), the PyTorch stage returns empty or zero
    features, and nothing crashes."""
    match = torch.rand(b, tq, td)
    d_mask = torch.ones(b, td, dtype=torch.bool)
    with torch.inference_mode():
        assert tk_kernels.native_sums(match, d_mask, MU, tk.KERNEL_SIGMA) is None
        log_feat, len_feat = tk.kernel_features(
            match, torch.ones(1, tq, dtype=torch.bool), d_mask, torch.tensor(MU), tk.KERNEL_SIGMA
        )
    assert log_feat.shape == len_feat.shape == (b, len(MU))
    assert torch.isfinite(log_feat).all() and torch.isfinite(len_feat).all()


@needs_cc
def test_loading_the_library_keeps_subnormal_floats(fresh_native):
    """A -ffast-math shared library built in one step by GCC < 13 carries crtfastmath.o, whose constructor sets
    flush-to-zero / denormals-are-zero for the whole process (every later torch and numpy computation, and
    hypothesis refuses to run). Ours is linked without it: subnormals survive loading it."""
    assert native.library() is not None
    tiny = torch.tensor([1e-38], dtype=torch.float32)
    assert (tiny / 1e3).item() > 0.0  # 1e-41: subnormal in float32
    assert (torch.tensor([1e-41], dtype=torch.float32) * 2).item() > 0.0


@needs_cc
@pytest.mark.parametrize("tq", [0, native.MAX_QUERY_TERMS + 1])
def test_the_c_stage_refuses_arguments_outside_its_limits(tq):
    """Called directly with a query length it cannot take (0 would divide by zero, more than 64 would overrun its
    scratch), the C entry point returns -1 and writes nothing; the Python side raises on any non-zero status."""
    lib = native.library()
    nc = tk_kernels._native_chain(MU, tk.KERNEL_SIGMA)
    m = torch.rand(2, 3, max(tq, 1))
    keep = torch.ones(2, 3, dtype=torch.uint8)
    out = torch.full((2, len(MU), max(tq, 1)), -7.0)
    status = lib.tk_kernel_sums(
        m.data_ptr(), keep.data_ptr(), 2, 3, tq, *tk_kernels._chain_args(nc, len(MU)), out.data_ptr(), 1
    )
    assert status == -1
    assert (out == -7.0).all()


@needs_cc
def test_without_openmp_the_kernels_build_serial(fresh_native, monkeypatch, caplog):
    """A compiler that cannot build with OpenMP (here: a flag it rejects beside -fopenmp) gets the serial build,
    says so once, and the kernels give the same sums."""
    match, _, d_mask = _adversarial_matches(9, 5, 30)
    with torch.inference_mode():
        want = tk_kernels.native_sums(match, d_mask, MU, tk.KERNEL_SIGMA)
    native._load.cache_clear()
    monkeypatch.setattr(native, "FLAGS", (*native.FLAGS, "-fno-such-flag-aheadrank"))
    with caplog.at_level(logging.WARNING, logger="aheadrank.native"):
        assert native.library() is not None
    assert any("without OpenMP" in r.getMessage() for r in caplog.records)
    with torch.inference_mode():
        got = tk_kernels.native_sums(match, d_mask, MU, tk.KERNEL_SIGMA)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


@needs_cc
def test_another_source_loads_beside_the_library(fresh_native, tmp_path):
    """load_source (bench/online_kernels.py --parts source: another revision's kernels against these): a source lacking
    entry points loads with require_all False, those entry points left out, and is refused with it True; its
    build is cached under its own name, beside the library's."""
    src = tmp_path / "other.c"
    src.write_text(
        "#include <stdint.h>\n"
        "int encoder_stack(const float *x, int64_t B, int64_t T, int64_t n, const void *mask, int64_t L,"
        " const int64_t *ptrs, const int64_t *dims, const float *eps, float *out, float *tmp, int64_t threads)"
        " { (void)x, (void)T, (void)n, (void)mask, (void)L, (void)ptrs, (void)dims, (void)eps, (void)out, (void)tmp,"
        " (void)threads; return (int)B + 40; }\n"
    )
    other = native.load_source(src, require_all=False)
    assert other.encoder_stack(None, 2, 1, 1, None, 1, None, None, None, None, None, 1) == 42
    assert getattr(other, "cross_attention", None) is None
    with pytest.raises(AttributeError):
        native.load_source(src)
    assert native.library() is not None
    assert len(list(fresh_native.glob("kernels-*.so"))) == 2
