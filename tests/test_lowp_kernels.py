"""The low-precision kernels (kernels/lowp.c, kernels/lowp.py): bf16/fp16 conversions, unscale, GEMMs.

Conversions are compared byte for byte: the C vector forms, the C scalar forms (``portable``), a
build for a plain x86-64 CPU (no AVX-512, no F16C), the NumPy fallback, and torch (``.to(bfloat16)``,
``.half()``, ``.float()``) and NumPy's ``astype(float16)`` on every value but NaN, whose bytes torch
and NumPy write differently by code path: there we check NaN in, quiet NaN of the same sign out.

GEMMs are compared with a float64 product of the rounded operands. The bound: every product of two
bf16 or fp16 values is exact in float32 (8- or 11-bit significands, a 24-bit product), so the only
rounding is the float32 sum of k terms (k + 1 with beta), and for any summation order
|sum - exact| <= gamma(k) * sum |a_ip b_pj| with gamma(k) = k u / (1 - k u), u = 2^-24 (Higham,
Accuracy and Stability, 3.1); a result rounded to bf16/fp16 adds half an ulp of that format.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from renaissance_nb.errors import ConfigError
from renaissance_nb.kernels import blas, lowp, native

needs_lib = pytest.mark.skipif(native.lib() is None, reason=f"no C kernels: {native.status().why_not}")
TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16}
U32 = 2.0 ** -24
HALF_ULP = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}


def same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape and a.itemsize == b.itemsize
    diff = np.count_nonzero(a.view(np.uint8) != b.view(np.uint8))
    assert a.tobytes() == b.tobytes(), f"{diff} bytes differ"


def edge_floats() -> np.ndarray:
    """float32 values where rounding to bf16/fp16 is delicate: zeros, subnormals of all three formats,
    the largest finite values and just past them, infinities, NaNs, and exact ties of both formats."""
    bits = [0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,
            0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF,
            0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F7F8000, 0x7F7F7FFF, 0x00008000, 0x00018000]
    vals = [65504.0, 65519.99, 65520.0, -65520.0, 65536.0, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25,
            2.0 ** -25 * 1.0000001, 5 * 2.0 ** -26, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 2.0 ** -15 + 2.0 ** -25,
            6.1e-5, 1e-8, -1e-8, 3.0e-39]
    x = np.array(bits, dtype=np.uint32).view(np.float32)
    return np.concatenate([x, np.array(vals, dtype=np.float32)])


def random_floats(n: int, seed: int = 0) -> np.ndarray:
    """Random bit patterns (every exponent) and values near 1 with random low bits (ties included)."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    near = (0x3F800000 + rng.integers(0, 2 ** 16, n // 4, dtype=np.uint32) * 0x100).astype(np.uint32)
    return np.concatenate([u, near, (u[: n // 4] & 0x807FFFFF) | 0x38000000]).view(np.float32)


def c_convert(src: np.ndarray, dst: np.ndarray, threads: int = 2, portable: bool = False) -> np.ndarray:
    kernel = lowp.bind_convert(src, dst, threads, portable)
    assert kernel is not None
    kernel()
    return dst


def torch_round(x: np.ndarray, fmt: str) -> np.ndarray:
    return torch.from_numpy(x).to(TORCH[fmt]).view(torch.int16).numpy().view(np.uint16)


def assert_quiet_nans(x: np.ndarray, h: np.ndarray, fmt: str) -> None:
    """Where x is NaN, h is a quiet NaN of x's sign."""
    nan = np.isnan(x)
    hb = h.view(np.uint16)[nan].astype(np.uint32)
    quiet = 0x0040 if fmt == "bf16" else 0x0200
    assert np.isnan(lowp.widen(h.view(lowp.STORAGE[fmt]), fmt)[nan]).all()
    assert ((hb & quiet) != 0).all()
    assert ((hb >> 15) == (x.view(np.uint32)[nan] >> 31)).all()


@needs_lib
@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_every_low_precision_value_widens_exactly(fmt: str) -> None:
    h = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16).view(lowp.STORAGE[fmt])
    vec = c_convert(h, np.empty(h.size, np.float32))
    scalar = c_convert(h, np.empty(h.size, np.float32), portable=True)
    same(vec, scalar)
    same(vec, lowp.widen(h, fmt))
    ref = torch.from_numpy(h.view(np.int16)).view(TORCH[fmt]).float().numpy()
    nan = np.isnan(ref)
    same(vec[~nan], ref[~nan])
    assert np.isnan(vec[nan]).all()
    if fmt == "bf16":  # the high half of a float32: every bit kept, a signalling NaN too
        same(vec.view(np.uint32), h.view(np.uint16).astype(np.uint32) << 16)
    else:  # vcvtph2ps quiets a NaN
        assert ((vec[nan].view(np.uint32) & 0x400000) != 0).all()
    assert np.count_nonzero(nan) == 2 * (2 ** (7 if fmt == "bf16" else 10) - 1)


@needs_lib
@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
@pytest.mark.parametrize("values", ["edges", "random"])
def test_rounding_matches_torch_numpy_and_both_c_forms(fmt: str, values: str) -> None:
    x = edge_floats() if values == "edges" else random_floats(400_003)
    dt = lowp.STORAGE[fmt]
    vec = c_convert(x, np.empty(x.size, dt)).view(np.uint16)
    same(vec, c_convert(x, np.empty(x.size, dt), portable=True).view(np.uint16))
    same(vec, lowp.round_to(x, fmt).view(np.uint16))
    nan = np.isnan(x)
    same(vec[~nan], torch_round(x, fmt)[~nan])
    if fmt == "fp16":
        with np.errstate(over="ignore"):
            same(vec[~nan], x[~nan].astype(np.float16).view(np.uint16))
    assert_quiet_nans(x, vec, fmt)


def test_rounding_rules_by_hand() -> None:
    """Ties go to even, overflow goes to inf, subnormals are kept (values worked out by hand)."""
    tie_down, tie_up = np.float32(1 + 2.0 ** -8), np.float32(1 + 3 * 2.0 ** -8)  # halfway between bf16 neighbours
    assert lowp.round_to(np.array([tie_down, tie_up]), "bf16").tolist() == [0x3F80, 0x3F82]
    h = lowp.round_to(np.array([65519.0, 65520.0, 2.0 ** -25, 3 * 2.0 ** -25, 1e-40], np.float32), "fp16")
    assert h.view(np.uint16).tolist() == [0x7BFF, 0x7C00, 0x0000, 0x0002, 0x0000]
    assert lowp.round_to(np.array([1e-40], np.float32), "bf16").tolist() == [0x0001]  # 1e-40 ~ 0x00011CC4


@needs_lib
@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_strided_blocks_touch_only_their_elements(fmt: str) -> None:
    rng = np.random.default_rng(1)
    big = rng.standard_normal((40, 70)).astype(np.float32)
    src = big[3:33, 5:50]  # row stride 70
    dst_big = np.full((35, 90), 0x1234, np.uint16).view(lowp.STORAGE[fmt])
    dst = dst_big[2:32, 10:55]  # row stride 90
    c_convert(src, dst)
    same(dst.copy().view(np.uint16), lowp.round_to(np.ascontiguousarray(src), fmt).view(np.uint16))
    guard = np.ones(dst_big.shape, bool)
    guard[2:32, 10:55] = False
    assert (dst_big.view(np.uint16)[guard] == 0x1234).all()
    back_big = np.zeros((31, 60), np.float32)
    c_convert(dst, back_big[1:31, 7:52])
    same(back_big[1:31, 7:52].copy(), lowp.widen(dst.copy(), fmt))
    assert not back_big[0].any() and not back_big[:, :7].any() and not back_big[:, 52:].any()


@needs_lib
@pytest.mark.parametrize("rows", [3, 300])
def test_threaded_chunks_of_strided_blocks(rows: int) -> None:
    """Above the threading threshold: row chunks (rows >= 8) or 16-aligned column chunks (fewer rows)."""
    cols = 120_000 // rows
    big = random_floats(rows * (cols + 9), seed=11)[: rows * (cols + 9)].reshape(rows, cols + 9)
    src = big[:, 4:4 + cols]
    for fmt in ("bf16", "fp16"):
        want = lowp.round_to(np.ascontiguousarray(src), fmt).view(np.uint16)
        for threads in (1, 2, 3):
            dst = np.zeros((rows, cols + 5), lowp.STORAGE[fmt])[:, 5:]
            same(c_convert(src, dst, threads).view(np.uint16), want)
            back = np.zeros((rows, cols + 3), np.float32)[:, :cols]
            same(c_convert(dst, back, threads), lowp.widen(dst.copy(), fmt))


def test_convert_falls_back_to_numpy_with_the_same_bytes() -> None:
    x = np.concatenate([edge_floats(), random_floats(10_000, seed=3)])
    for fmt in ("bf16", "fp16"):
        with native.chosen_for({"an op only numba has"}):  # the binders decline: NumPy serves
            assert lowp.bind_convert(x, np.empty(x.size, lowp.STORAGE[fmt]), 1) is None
            h = np.empty(x.size, lowp.STORAGE[fmt])
            lowp.convert(x, h)()
            back = np.empty(x.size, np.float32)
            lowp.convert(h, back)()
        same(h.view(np.uint16), lowp.round_to(x, fmt).view(np.uint16))
        same(back, lowp.widen(h, fmt))
        if native.lib() is not None:
            same(h.view(np.uint16), c_convert(x, np.empty(x.size, lowp.STORAGE[fmt])).view(np.uint16))


def test_bad_conversion_operands_are_named() -> None:
    with pytest.raises(ConfigError, match="dst=.*float32 on exactly one side"):
        lowp.convert(np.zeros(4, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ConfigError, match="dtype=.*int32.*uint16 \\(bf16 storage\\)"):
        lowp.convert(np.zeros(4, np.float32), np.zeros(4, np.int32))


# ---- unscale ---------------------------------------------------------------------------------------
def torch_unscale(g32: np.ndarray, inv: float) -> tuple[np.ndarray, float]:
    t = torch.from_numpy(g32.copy())
    found = torch.zeros(1)
    torch._amp_foreach_non_finite_check_and_unscale_([t], found, torch.tensor([inv], dtype=torch.float32))
    return t.numpy(), float(found[0])


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("bad", [None, np.inf, -np.inf, np.nan])
def test_unscale_matches_torch_and_finds_overflow(fmt: str, bad: float | None) -> None:
    rng = np.random.default_rng(2)
    g32 = (rng.standard_normal(100_001) * 2.0 ** 12).astype(np.float32)
    if bad is not None:
        g32[77_777] = bad
    g = g32 if fmt == "fp32" else lowp.round_to(g32, fmt)
    inv = np.array([2.0 ** -16 * 1.5], np.float32)
    want, want_found = torch_unscale(lowp.widen(g, fmt) if fmt != "fp32" else g32, float(inv[0]))
    outs = []
    for threads, portable, use_c in ((1, False, True), (2, False, True), (2, True, True), (1, False, False)):
        out, found = np.zeros(g.size, np.float32), np.zeros(1, np.float32)
        if use_c and native.lib() is not None:
            kernel = lowp.bind_unscale(g, out, inv, found, threads, portable)
        else:
            with native.chosen_for({"an op only numba has"}):
                kernel = lowp.unscale(g, out, inv, found, threads)
        assert kernel is not None
        assert kernel() == (bad is not None)
        assert found[0] == want_found == (1.0 if bad is not None else 0.0)
        outs.append(out)
        fin = np.isfinite(want)
        same(out[fin], want[fin])
        assert np.array_equal(np.isnan(out), np.isnan(want))
        assert np.array_equal(out[np.isinf(out)], want[np.isinf(want)])
    for o in outs[1:]:
        same(o, outs[0])


@needs_lib
def test_unscale_in_place_and_found_is_never_cleared() -> None:
    g = np.array([1.0, 2.0, 3.0], np.float32)
    inv, found = np.array([0.5], np.float32), np.array([1.0], np.float32)
    kernel = lowp.bind_unscale(g, g, inv, found, 1)
    assert kernel is not None and kernel() == 0
    assert g.tolist() == [0.5, 1.0, 1.5] and found[0] == 1.0  # a finite call leaves an earlier overflow flagged
    inv[0] = 4.0  # the kernel reads the scale at each call (the scaler updates it in place)
    kernel()
    assert g.tolist() == [2.0, 4.0, 6.0]


# ---- GEMM ------------------------------------------------------------------------------------------
def gemm_paths(fmt: str) -> list[str]:
    if native.lib() is None:
        return ["auto"]
    paths = ["loops"] + (["sgemm"] if blas.SGEMM.address else [])
    return paths + (["dpbf16"] if fmt == "bf16" and "avx512bf16" in lowp.features() else [])


CASES = [(fmt, p) for fmt in ("bf16", "fp16") for p in ("auto", "loops", "sgemm", "dpbf16") if p in gemm_paths(fmt)
         or p == "auto"]


def operands(fmt: str, m: int, n: int, k: int, orient: str, seed: int = 0):  # type: ignore[no-untyped-def]
    """A (m, k) and B (k, n) rounded to fmt, and views of them stored as ``orient`` says (T: transposed
    in memory, as w.T is in y = x @ w.T)."""
    rng = np.random.default_rng(seed)
    A = lowp.round_to(rng.standard_normal((m, k)).astype(np.float32), fmt)
    B = lowp.round_to(rng.standard_normal((k, n)).astype(np.float32), fmt)
    a = A if orient[0] == "N" else np.ascontiguousarray(A.T).T
    b = B if orient[1] == "N" else np.ascontiguousarray(B.T).T
    return A, B, a, b


def run(a: np.ndarray, b: np.ndarray, c: np.ndarray, threads: int = 2, beta: bool = False, path: str = "auto",
        portable: bool = False) -> np.ndarray:
    fmt, out = lowp.format_of(a.dtype), lowp.format_of(c.dtype)
    scratch = np.full(lowp.scratch_elems(a.shape[0], b.shape[1], a.shape[1], fmt, out, path), np.nan, np.float32)
    kernel = lowp.bind_gemm(a, b, c, scratch, threads, beta, path, portable) if native.lib() else None
    kernel = kernel or lowp.gemm(a, b, c, scratch, threads, beta, path)
    with blas.own_cores():
        kernel()
    return c


def check_bound(got: np.ndarray, A: np.ndarray, B: np.ndarray, fmt: str, out: str, c_in: np.ndarray | None) -> None:
    """|got - exact| within float32 summation's bound, plus half an ulp of ``out`` when it is rounded."""
    a64, b64 = lowp.widen(A, fmt).astype(np.float64), lowp.widen(B, fmt).astype(np.float64)
    exact, mag = a64 @ b64, np.abs(a64) @ np.abs(b64)
    terms = A.shape[1] + (c_in is not None)
    if c_in is not None:
        exact, mag = exact + c_in, mag + np.abs(c_in)
    gamma = terms * U32 / (1 - terms * U32)
    tol = gamma * mag
    g = got.astype(np.float64) if out == "fp32" else lowp.widen(got, fmt).astype(np.float64)
    if out != "fp32":
        tol = tol + HALF_ULP[fmt] * (np.abs(exact) + tol)
    err = np.abs(g - exact)
    assert (err <= tol).all(), f"worst error {(err / np.maximum(tol, 1e-300)).max():.2f} x the bound"
    assert err.max() > 0 or terms <= 2  # the sums did round somewhere: the bound is not vacuous here


@pytest.mark.parametrize("fmt,path", CASES)
@pytest.mark.parametrize("orient", ["NT", "NN", "TN", "TT"])
@pytest.mark.parametrize("shape", [(37, 70, 51), (6, 64, 2), (1, 1, 1), (13, 130, 7), (128, 100, 300)])
def test_gemm_within_the_float32_sum_bound(fmt: str, path: str, orient: str, shape: tuple[int, int, int]) -> None:
    m, n, k = shape
    A, B, a, b = operands(fmt, m, n, k, orient)
    c = run(a, b, np.full((m, n), np.nan, np.float32), path=path)
    check_bound(c, A, B, fmt, "fp32", None)


@pytest.mark.parametrize("fmt,path", CASES)
def test_gemm_over_an_empty_sum(fmt: str, path: str) -> None:
    """k = 0: c = 0, or c unchanged with beta (no BLAS call with a zero leading dimension)."""
    a, b = np.zeros((5, 0), lowp.STORAGE[fmt]), np.zeros((0, 7), lowp.STORAGE[fmt])
    for out in (np.float32, lowp.STORAGE[fmt]):
        assert not run(a, b, np.full((5, 7), 3, out), path=path).view(np.uint16 if out != np.float32 else out).any()
        assert (run(a, b, np.full((5, 7), 3, out), beta=True, path=path) == 3).all()


@pytest.mark.parametrize("fmt,path", CASES)
@pytest.mark.parametrize("out", ["fp32", "low"])
def test_gemm_adds_to_c_and_rounds_the_result(fmt: str, path: str, out: str) -> None:
    m, n, k = 45, 83, 129
    A, B, a, b = operands(fmt, m, n, k, "NT", seed=4)
    c0 = np.random.default_rng(5).standard_normal((m, n)).astype(np.float32) * 10
    c = c0 if out == "fp32" else lowp.round_to(c0, fmt)
    c_in = (c0 if out == "fp32" else lowp.widen(c, fmt)).astype(np.float64)
    got = run(a, b, c.copy(), beta=True, path=path)
    check_bound(got, A, B, fmt, "fp32" if out == "fp32" else fmt, c_in)
    fresh = run(a, b, np.zeros_like(c), path=path)
    check_bound(fresh, A, B, fmt, "fp32" if out == "fp32" else fmt, None)


@needs_lib
@pytest.mark.parametrize("fmt,path", [c for c in CASES if c[1] != "auto"])
@pytest.mark.parametrize("orient", ["NT", "NN", "TN"])
def test_gemm_bytes_do_not_depend_on_the_thread_count(fmt: str, path: str, orient: str) -> None:
    A, B, a, b = operands(fmt, 160, 300, 70, orient, seed=6)
    for out in (np.float32, lowp.STORAGE[fmt]):
        one = run(a, b, np.zeros((160, 300), out), threads=1, path=path)
        same(run(a, b, np.zeros((160, 300), out), threads=2, path=path), one)
        same(run(a, b, np.zeros((160, 300), out), threads=3, path=path), one)
        same(run(a, b, np.zeros((160, 300), out), threads=2, path=path, portable=True), one)


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
@pytest.mark.parametrize("orient", ["NT", "NN", "TN"])
def test_gemm_near_torch_matmul(fmt: str, orient: str) -> None:
    """torch's bf16/fp16 matmul (float32 sums in its own order, result rounded to the format): within an
    ulp of the format plus both float32 sums' error bounds (a result that nearly cancels can be several
    fp16 ulps off exact in either), and mostly the same bytes."""
    m, n, k = 64, 96, 200
    A, B, a, b = operands(fmt, m, n, k, orient, seed=7)
    ours = lowp.widen(run(a, b, np.zeros((m, n), lowp.STORAGE[fmt])), fmt)
    ta = torch.from_numpy(A.view(np.int16)).view(TORCH[fmt])
    tb = torch.from_numpy(B.view(np.int16)).view(TORCH[fmt])
    theirs = torch.matmul(ta, tb).float().numpy()
    ulp = 2.0 * HALF_ULP[fmt]
    sums = 2 * k * U32 / (1 - k * U32) * (np.abs(lowp.widen(A, fmt)) @ np.abs(lowp.widen(B, fmt)))
    assert (np.abs(ours - theirs) <= ulp * np.maximum(np.abs(ours), np.abs(theirs)) + sums).all()
    assert np.mean(ours == theirs) > 0.9


def test_gemm_numpy_fallback_within_the_bound() -> None:
    for fmt in ("bf16", "fp16"):
        A, B, a, b = operands(fmt, 33, 47, 65, "TN", seed=8)
        with native.chosen_for({"an op only numba has"}):
            scratch = np.zeros(lowp.scratch_elems(33, 47, 65, fmt, fmt), np.float32)
            c = lowp.round_to(np.ones((33, 47), np.float32), fmt)
            lowp.gemm(a, b, c, scratch, beta=True)()
        check_bound(c, A, B, fmt, fmt, np.ones((33, 47)))


def test_gemm_bad_operands_are_named() -> None:
    A, B, a, b = operands("bf16", 4, 5, 6, "NN")
    c = np.zeros((4, 5), np.float32)
    with pytest.raises(ConfigError, match="operands=.*both uint16 \\(bf16\\) or both float16"):
        lowp.gemm(a, b.view(np.float16), c, np.zeros(1000, np.float32))
    with pytest.raises(ConfigError, match="operands=.*c \\(m, n\\)"):
        lowp.gemm(a, b, np.zeros((5, 4), np.float32), np.zeros(1000, np.float32))
    with pytest.raises(ConfigError, match="scratch=.*at least .* elements.*lowp.scratch_elems"):
        lowp.gemm(a, b, c, np.zeros(3, np.float32))
    with pytest.raises(ConfigError, match="path='vnni'"):
        lowp.scratch_elems(4, 5, 6, "bf16", path="vnni")


@needs_lib
def test_path_names_what_was_built() -> None:
    line = lowp.path()
    assert ("vdpbf16ps" in line) == ("avx512bf16" in lowp.features())
    assert lowp.gemm_path("fp16") == ("sgemm" if blas.SGEMM.address else "loops")
    if "avx512bf16" not in lowp.features():
        with pytest.raises(ConfigError, match="path='dpbf16'"):
            lowp.gemm_path("bf16", "dpbf16")
    with pytest.raises(ConfigError, match="path='dpbf16'"):
        lowp.gemm_path("fp16", "dpbf16")


@needs_lib
def test_a_build_for_a_plain_x86_64_cpu_gives_the_same_bytes(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """lowp.c compiled without AVX-512 or F16C (the scalar forms, the loops and sgemm paths) converts and
    multiplies to this build's bytes."""
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("an x86-64 check")
    monkeypatch.setenv("RNB_CACHE_DIR", str(tmp_path))
    plain = native.build(flags=tuple("-march=x86-64" if f == "-march=native" else f for f in native.FLAGS))
    assert plain.lib is not None, plain.why_not
    P = plain.lib
    assert P.rnb_lowp_built() == 0 and P.rnb_lowp_gemm_path(1, 0, 1) == lowp.PATHS["sgemm"]
    x = np.concatenate([edge_floats(), random_floats(50_000, seed=9)])
    for fmt in ("bf16", "fp16"):
        h = np.empty(x.size, lowp.STORAGE[fmt])
        assert P.rnb_lowp_convert(0, lowp.CODE[fmt], x.ctypes.data, 1, x.size, x.size, h.ctypes.data, x.size, 0, 2) == 0
        same(h.view(np.uint16), c_convert(x, np.empty(x.size, lowp.STORAGE[fmt])).view(np.uint16))
        every = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16)
        back = np.empty(every.size, np.float32)
        P.rnb_lowp_convert(lowp.CODE[fmt], 0, every.ctypes.data, 1, every.size, every.size, back.ctypes.data,
                           every.size, 0, 2)
        same(back, c_convert(every.view(lowp.STORAGE[fmt]), np.empty(every.size, np.float32)))
        for path in [p for p in ("loops", "sgemm") if p in gemm_paths(fmt)]:
            A, B, a, b = operands(fmt, 50, 140, 33, "NT", seed=10)
            want = run(a, b, np.zeros((50, 140), np.float32), path=path)
            got = np.zeros((50, 140), np.float32)
            scratch = np.zeros(lowp.scratch_elems(50, 140, 33, fmt, "fp32", path), np.float32)
            with blas.own_cores():
                ran = P.rnb_lowp_gemm(lowp.CODE[fmt], 0, 1, 50, 140, 33, a.ctypes.data, 33, b.ctypes.data, 33, 0,
                                      got.ctypes.data, 140, 0, blas.SGEMM.address or None,
                                      int(blas.SGEMM.int_bits == 64), scratch.ctypes.data, scratch.size,
                                      lowp.PATHS[path], 0, 2)
            assert ran == lowp.PATHS[path]
            same(got, want)


@needs_lib
def test_dpbf16_reads_subnormal_operands_as_zero_as_the_instruction_does() -> None:
    """The documented difference between the paths beyond summation order (lowp.py's docstring)."""
    if "dpbf16" not in gemm_paths("bf16"):
        pytest.skip("no AVX-512 BF16 in this build")
    a = np.full((6, 2), 0x0001, np.uint16)  # the smallest subnormal bf16, about 9.2e-41
    b = lowp.round_to(np.full((2, 16), 2.0 ** 100, np.float32), "bf16")
    dp = run(a, b, np.zeros((6, 16), np.float32), path="dpbf16")
    assert not dp.any()
    if "sgemm" in gemm_paths("bf16"):
        plain = run(a, b, np.zeros((6, 16), np.float32), path="sgemm")
        assert np.allclose(plain, 2 * 2.0 ** -133 * 2.0 ** 100)
