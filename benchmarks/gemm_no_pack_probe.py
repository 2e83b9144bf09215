"""Could our own sgemm beat oneMKL at the MLP step's shapes? A probe, kept with its result.

    python benchmarks/gemm_no_pack_probe.py [--rounds 7] [--out FILE]

Why: issue #5's last open target is 75% of the GEMM roofline. The step's products run at
about 0.8 of the 1024^3 rate, and at batch 128 a BLAS repacks the weight matrix on every
call: K x N floats copied for only M = 128 rows of reuse. A kernel that reads the weights
where they lie would skip that copy. This script builds such kernels (register tiles of
MR rows x NV 16-float vectors, broadcast from A, vector loads straight from row-major B,
optionally K-blocked) in LLVM IR through llvmlite, checks them against float64 products,
and times them single-threaded beside oneMKL's sgemm at the step's NN (dx) and TN (dW)
shapes, interleaved round by round, each as a fraction of MKL's 1024^3 rate in that round.
The forward products (NT) would also need a transposed store; they were not built, since
the simpler two did not win.

Not a timed test, and not used by the library: a recorded negative result
(benchmarks/results/gemm_no_pack_probe.txt).
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
from pathlib import Path

import llvmlite.binding as ll
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlp_cpu import _median_time as seconds  # noqa: E402

from renaissance_nb.kernels import blas  # noqa: E402

V = "<16 x float>"
TILES = [(8, 3), (6, 4), (14, 2), (10, 2), (4, 4)]
K_BLOCKS = [128, 256, 1 << 30]
SHAPES = [  # (name, m, n, k, A transposed, ldb): one band of the step's product, as the replay calls it
    ("NN dx2 128x1024x512", 128, 1024, 512, False, 1040),
    ("NN dx3 128x512x256", 128, 512, 256, False, 512),
    ("TN dW1 512x784x128", 512, 784, 128, True, 784),
    ("TN dW2 512x1024x128", 512, 1024, 128, True, 1024),
]


def tile_ir(mr: int, nv: int) -> str:
    """C[mr x 16nv] (+)= sum_k A[r*ars + k*aks] * B[k*ldb + j]: accumulators stay in registers."""
    name = f"tile_{mr}_{nv}"
    out = [f"define void @{name}(float* noalias %A, i64 %ars, i64 %aks, float* noalias %B, i64 %ldb, "
           f"float* noalias %C, i64 %ldc, i64 %K, i1 %accum) #0 {{", "entry:"]
    for r in range(mr):
        out += [f"  %ar{r} = mul i64 %ars, {r}", f"  %ap{r} = getelementptr float, float* %A, i64 %ar{r}",
                f"  %cr{r} = mul i64 %ldc, {r}"]
        for v in range(nv):
            out += [f"  %co{r}_{v} = add i64 %cr{r}, {16 * v}",
                    f"  %cs{r}_{v} = getelementptr float, float* %C, i64 %co{r}_{v}",
                    f"  %cp{r}_{v} = bitcast float* %cs{r}_{v} to {V}*",
                    f"  %cl{r}_{v} = load {V}, {V}* %cp{r}_{v}, align 4",
                    f"  %init{r}_{v} = select i1 %accum, {V} %cl{r}_{v}, {V} zeroinitializer"]
    out += ["  br label %loop", "loop:", "  %k = phi i64 [0, %entry], [%k1, %loop]"]
    for r in range(mr):
        for v in range(nv):
            out.append(f"  %acc{r}_{v} = phi {V} [%init{r}_{v}, %entry], [%new{r}_{v}, %loop]")
    out += ["  %bo = mul i64 %k, %ldb", "  %bp = getelementptr float, float* %B, i64 %bo", "  %ao = mul i64 %k, %aks"]
    for v in range(nv):
        out += [f"  %bs{v} = getelementptr float, float* %bp, i64 {16 * v}",
                f"  %bv{v} = bitcast float* %bs{v} to {V}*", f"  %b{v} = load {V}, {V}* %bv{v}, align 4"]
    for r in range(mr):
        out += [f"  %ak{r} = getelementptr float, float* %ap{r}, i64 %ao", f"  %a{r} = load float, float* %ak{r}, align 4",
                f"  %ai{r} = insertelement {V} undef, float %a{r}, i32 0",
                f"  %as{r} = shufflevector {V} %ai{r}, {V} undef, <16 x i32> zeroinitializer"]
        for v in range(nv):
            out.append(f"  %new{r}_{v} = call {V} @llvm.fma.v16f32({V} %as{r}, {V} %b{v}, {V} %acc{r}_{v})")
    out += ["  %k1 = add i64 %k, 1", "  %more = icmp slt i64 %k1, %K", "  br i1 %more, label %loop, label %done", "done:"]
    for r in range(mr):
        for v in range(nv):
            out.append(f"  store {V} %new{r}_{v}, {V}* %cp{r}_{v}, align 4")
    return "\n".join(out + ["  ret void", "}"])


def driver_ir(mr: int, nv: int) -> str:
    """Whole tiles only: column blocks of 16nv, then K blocks of kc, then row blocks of mr."""
    return f"""
define void @gemm_{mr}_{nv}(i64 %m, i64 %n, i64 %K, float* %A, i64 %ars, i64 %aks, float* %B, i64 %ldb,
                            float* %C, i64 %ldc, i64 %kc) #0 {{
entry:
  br label %jl
jl:
  %j = phi i64 [0, %entry], [%j1, %jn]
  br label %kl
kl:
  %k0 = phi i64 [0, %jl], [%k1, %kn]
  %krem = sub i64 %K, %k0
  %kbig = icmp slt i64 %kc, %krem
  %kk = select i1 %kbig, i64 %kc, i64 %krem
  %accum = icmp sgt i64 %k0, 0
  %ako = mul i64 %k0, %aks
  %bko0 = mul i64 %k0, %ldb
  %bko = add i64 %bko0, %j
  %bp = getelementptr float, float* %B, i64 %bko
  br label %il
il:
  %i = phi i64 [0, %kl], [%i1, %il]
  %ao0 = mul i64 %i, %ars
  %ao = add i64 %ao0, %ako
  %ap = getelementptr float, float* %A, i64 %ao
  %co0 = mul i64 %i, %ldc
  %co = add i64 %co0, %j
  %cp = getelementptr float, float* %C, i64 %co
  call void @tile_{mr}_{nv}(float* %ap, i64 %ars, i64 %aks, float* %bp, i64 %ldb, float* %cp, i64 %ldc, i64 %kk, i1 %accum)
  %i1 = add i64 %i, {mr}
  %im = icmp slt i64 %i1, %m
  br i1 %im, label %il, label %kn
kn:
  %k1 = add i64 %k0, %kc
  %km = icmp slt i64 %k1, %K
  br i1 %km, label %kl, label %jn
jn:
  %j1 = add i64 %j, {16 * nv}
  %jm = icmp slt i64 %j1, %n
  br i1 %jm, label %jl, label %out
out:
  ret void
}}"""


def build() -> tuple[object, dict[tuple[int, int], object]]:
    ll.initialize_native_target()
    ll.initialize_native_asmprinter()
    src = "\n".join(["declare <16 x float> @llvm.fma.v16f32(<16 x float>, <16 x float>, <16 x float>)"]
                    + [tile_ir(*t) + driver_ir(*t) for t in TILES]
                    + ['attributes #0 = { nounwind "min-legal-vector-width"="512" "prefer-vector-width"="512" }'])
    mod = ll.parse_assembly(src)
    mod.verify()
    tm = ll.Target.from_default_triple().create_target_machine(
        cpu=ll.get_host_cpu_name(), features=ll.get_host_cpu_features().flatten(), opt=3, codemodel="jitdefault")
    pb = ll.create_pass_builder(tm, ll.create_pipeline_tuning_options(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    ee = ll.create_mcjit_compiler(mod, tm)
    ee.finalize_object()
    i64, p = ctypes.c_int64, ctypes.c_void_p
    fn = ctypes.CFUNCTYPE(None, i64, i64, i64, p, i64, i64, p, i64, p, i64, i64)
    return ee, {t: fn(ee.get_function_address(f"gemm_{t[0]}_{t[1]}")) for t in TILES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    mkl = blas.loaded_sgemms().get("mkl")
    if mkl is None:
        sys.exit("oneMKL is not loaded here (pip install 'renaissance_nb[mkl]'); nothing to compare against")
    c_int, c_f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    sgemm = ctypes.CFUNCTYPE(None, c_int, c_int, c_int, c_int, c_int, c_int, c_f, p, c_int, p, c_int, c_f, p,
                             c_int)(mkl.address)
    ee, kernels = build()
    rng = np.random.default_rng(0)
    big = rng.standard_normal((1024, 1024)).astype(np.float32)
    big_c = np.empty_like(big)
    cases = []
    for name, m, n, k, trans, ldb in SHAPES:
        a = rng.standard_normal((k, m) if trans else (m, k)).astype(np.float32)
        b = rng.standard_normal((k, ldb)).astype(np.float32)
        ref = (a.T if trans else a).astype(np.float64) @ b[:, :n].astype(np.float64)
        cases.append((name, m, n, k, trans, ldb, a, b, ref, np.empty((m, n), np.float32)))
    ratios: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        rate = 2 * 1024**3 / seconds(lambda: sgemm(101, 111, 111, 1024, 1024, 1024, 1.0, big.ctypes.data, 1024,
                                                   big.ctypes.data, 1024, 0.0, big_c.ctypes.data, 1024), 5)
        for name, m, n, k, trans, ldb, a, b, ref, c in cases:
            ta, lda = (112, m) if trans else (111, k)
            t = seconds(lambda: sgemm(101, ta, 111, m, n, k, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb, 0.0,
                                      c.ctypes.data, n), 20)
            ratios.setdefault((name, "MKL"), []).append(2 * m * n * k / t / rate)
            ars, aks = (1, m) if trans else (k, 1)
            for (mr, nv), f in kernels.items():
                mm, nn = m - m % mr, n - n % (16 * nv)  # whole tiles; the rate counts only what was computed
                for kc in K_BLOCKS:
                    c[...] = np.nan
                    t = seconds(lambda: f(mm, nn, k, a.ctypes.data, ars, aks, b.ctypes.data, ldb, c.ctypes.data, n, kc), 20)
                    err = float(np.abs(c[:mm, :nn] - ref[:mm, :nn]).max())
                    if not err < 1e-3:
                        sys.exit(f"{name} tile {mr}x{16 * nv} kc={kc}: wrong result (max error {err})")
                    label = f"{mr}x{16 * nv}" + ("" if kc >= k else f"/k{kc}")
                    ratios.setdefault((name, label), []).append(2 * mm * nn * k / t / rate)
    lines = [f"single-threaded, as fractions of oneMKL's 1024^3 rate in the same round; medians of {args.rounds} "
             f"interleaved rounds ({ll.get_host_cpu_name()})"]
    for name, *_ in SHAPES:
        row = {lab: statistics.median(v) for (nm, lab), v in ratios.items() if nm == name}
        best = max((lab for lab in row if lab != "MKL"), key=row.get)
        lines.append(f"  {name:22s} MKL {row['MKL']:.2f}   best of ours {row[best]:.2f} ({best})   "
                     f"all: " + " ".join(f"{lab} {v:.2f}" for lab, v in sorted(row.items()) if lab != "MKL"))
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
