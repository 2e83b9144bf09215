"""fc's forward and backward on 16-bit operands, for mixed precision (compiler/autocast.py).

Why kernels of their own: a product whose operands are widened into fp32 buffers first needs fp32
copies of the weights and activations in the arena, and does the arithmetic of an fp32 GEMM. These
read bf16/fp16 directly (kernels/lowp.py: AVX-512 BF16's vdpbf16ps tiles where the CPU has them,
else the operands widened panel by panel into the node's workspace for OpenBLAS's sgemm), sum in
fp32 and round once, as a 16-bit GEMM with fp32 accumulation does. What stays fp32 is the layer's
output-sized sums: the bias and activation are applied to them before rounding (forward), and the
activation's gradient and the bias gradient are taken on them (backward), in the fp32 passes the fp32
kernels use (kernels/passes.py). Each kernel is a chain of C calls where the library is loaded, so a
step of them packs into the native program (kernels/program.py).
"""
from __future__ import annotations

from typing import Any

from . import blas, lowp, program
from .lowp import bits
from .base import EMPTY_F32, BindEnv, Factory, Kernel, registrar
from .operands import ACT_CODES, split_scratch
from .passes import act_grad_colsum_pass, bias_act_pass, bias_partials

FC_LOWP_KERNELS: dict[str, Factory] = {}
kernel = registrar(FC_LOWP_KERNELS)
@kernel("fc_fwd_lowp")
def fc_fwd_lowp(outs: Any, ins: Any, p: dict, env: BindEnv) -> Kernel:
    """y = round(act(x W^T + b)): the product of 16-bit x and W summed in fp32 into ``sums``, the fp32 bias
    and activation pass on them, then one rounding into y."""
    (y,), scratch = split_scratch(outs, p)
    w = bits(ins[1])
    x = bits(ins[0]).reshape(-1, w.shape[1])
    sums, y2 = scratch["sums"].reshape(-1, w.shape[0]), bits(y).reshape(-1, w.shape[0])
    b = ins[2] if len(ins) > 2 else EMPTY_F32
    threads = blas.pass_threads(blas.THREADED)
    product = lowp.gemm(x, w.T, sums, scratch["work"], threads)
    act = ACT_CODES[p.get("act", "none")]
    bias_act = bias_act_pass(sums, b, act, float(p.get("slope", 0.0))) if (act or b.size) else None
    rounding = lowp.convert(sums, y2, threads)
    return program.chain(*(k for k in (product, bias_act, rounding) if k is not None))


@kernel("fc_bwd_lowp")
def fc_bwd_lowp(outs: Any, ins: Any, p: dict, env: BindEnv) -> Kernel:
    """dz = dy * act'(y) and db = 1^T dz on fp32 copies (``grads``, ``outputs``), dz rounded back into dy,
    then dW = round(dz^T x) and dx = round(dz W) from the 16-bit operands."""
    dy, x, w, y = (bits(a) for a in ins[:4])
    rest, scratch = split_scratch(outs, p)
    dw = bits(rest.pop(0))
    db = rest.pop(0) if p["bias"] else None
    out, fan_in = w.shape
    dx = bits(rest.pop(0)).reshape(-1, fan_in) if p["need_dx"] else None
    dy2, x2, y2 = dy.reshape(-1, out), x.reshape(-1, fan_in), y.reshape(-1, out)
    dz = scratch["grads"].reshape(-1, out)
    act = ACT_CODES[p["act"]]
    threads = blas.pass_threads(blas.THREADED)
    steps: list[Kernel] = []
    if act or db is not None:  # the products read dy itself; its fp32 copy serves these passes
        steps.append(lowp.convert(dy2, dz, threads))
        yz = scratch["outputs"].reshape(-1, out) if act else dz
        if act:
            steps.append(lowp.convert(y2, yz, threads))
        parts = bias_partials(scratch, db, env, "fc_bwd_lowp")
        steps += [act_grad_colsum_pass(dz, yz, act, float(p["slope"]), db, parts)]
        if act:
            steps.append(lowp.convert(dz, dy2, threads))  # act'(y) applied: dz rounded, as a 16-bit backward
    steps.append(lowp.gemm(dy2.T, x2, dw, scratch["work"], threads))
    if dx is not None:
        steps.append(lowp.gemm(dy2, w, dx, scratch["work"], threads))
    return program.chain(*steps)
