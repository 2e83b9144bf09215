// renaissance_nb: mixed precision's GPU kernels (compiler/autocast.py): casts, GradScaler's unscale and
// update. The conversions are integer bit operations, not __nv_bfloat16 / __half intrinsics, so that g++
// compiles them in the CPU harness (tests/cuda_emulator.py) and their bytes are kernels/lowp.c's:
// round to nearest even, subnormals kept, overflow to inf, a NaN kept quiet with its sign and top
// payload bits (bf16: the high half | 0x40; fp16: sign | 0x7E00 | the top 10 payload bits).
// Formats: 0 fp32, 1 bf16 (uint16 storage: the high half of a float32), 2 fp16 (lowp.py's CODE).

RNB_HD rnb_u32 rnb_f32_bits(float x) { union { float f; rnb_u32 u; } v; v.f = x; return v.u; }
RNB_HD float rnb_bits_f32(rnb_u32 u) { union { float f; rnb_u32 u; } v; v.u = u; return v.f; }

RNB_HD unsigned short rnb_f32_to_bf16(float x) {
    rnb_u32 u = rnb_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

RNB_HD float rnb_bf16_to_f32(unsigned short h) { return rnb_bits_f32((rnb_u32)h << 16); }

RNB_HD unsigned short rnb_f32_to_f16(float x) {
    rnb_u32 u = rnb_f32_bits(x);
    rnb_u32 sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (unsigned short)(sign | 0x7E00u | ((u >> 13) & 0x3FFu));  // NaN
    if (a >= 0x477FF000u) return (unsigned short)(sign | 0x7C00u);  // 65520 and up (ties to even) -> inf
    if (a >= 0x38800000u)  // a normal half: round at bit 13, then rebias the exponent (127 -> 15)
        return (unsigned short)(sign | ((a + 0x0FFFu + ((a >> 13) & 1u) - 0x38000000u) >> 13));
    if (a < 0x33000000u) return (unsigned short)sign;  // below 2^-25: rounds to a zero
    rnb_u32 shift = 126u - (a >> 23);                  // a subnormal half: units of 2^-24
    rnb_u32 m = (a & 0x7FFFFFu) | 0x800000u;
    rnb_u32 q = m >> shift, rem = m & ((1u << shift) - 1u), mid = 1u << (shift - 1u);
    if (rem > mid || (rem == mid && (q & 1u))) q += 1u;  // may carry into the smallest normal: its code
    return (unsigned short)(sign | q);
}

RNB_HD float rnb_f16_to_f32(unsigned short h) {
    rnb_u32 sign = ((rnb_u32)h & 0x8000u) << 16, e = ((rnb_u32)h >> 10) & 0x1Fu, m = (rnb_u32)h & 0x3FFu;
    if (e == 0x1Fu) return rnb_bits_f32(sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0u));  // quiet NaN
    if (e == 0u) {
        if (m == 0u) return rnb_bits_f32(sign);
        e = 113u;  // 2^-14 with the implicit bit at 0x400: normalise the subnormal
        while (!(m & 0x400u)) { m <<= 1; e -= 1u; }
        return rnb_bits_f32(sign | (e << 23) | ((m & 0x3FFu) << 13));
    }
    return rnb_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

RNB_HD float rnb_load(const void* p, int fmt, rnb_i64 i) {
    if (fmt == 1) return rnb_bf16_to_f32(((const unsigned short*)p)[i]);
    if (fmt == 2) return rnb_f16_to_f32(((const unsigned short*)p)[i]);
    return ((const float*)p)[i];
}

RNB_HD void rnb_store(void* p, int fmt, rnb_i64 i, float v) {
    if (fmt == 1) ((unsigned short*)p)[i] = rnb_f32_to_bf16(v);
    else if (fmt == 2) ((unsigned short*)p)[i] = rnb_f32_to_f16(v);
    else ((float*)p)[i] = v;
}

// dst = src converted, over a (rows, cols) block with row strides lds and ldd (padded weight rows):
// times scale[0] first when scaled (the logits' gradient by GradScaler's scale), then rounded to
// ``via`` and back when via is 1 or 2 (an fp32 activation a low-precision product reads). In place
// (src == dst) each element is read before it is written.
extern "C" __global__ void rnb_cast(const void* src, int src_fmt, rnb_i64 lds, void* dst, int dst_fmt, rnb_i64 ldd,
                                    rnb_i64 rows, rnb_i64 cols, int via, const float* scale, int scaled) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < rows * cols;
         k += (rnb_i64)gridDim.x * blockDim.x) {
        rnb_i64 r = k / cols, c = k % cols;
        float v = rnb_load(src, src_fmt, r * lds + c);
        if (scaled) v = v * scale[0];
        if (via == 1) v = rnb_bf16_to_f32(rnb_f32_to_bf16(v));
        else if (via == 2) v = rnb_f16_to_f32(rnb_f32_to_f16(v));
        rnb_store(dst, dst_fmt, r * ldd + c, v);
    }
}

// GradScaler.unscale_: the fp32 gradients times 1/scale, the reciprocal taken in double and rounded to
// float32 once, as torch (and kernels/amp.py) do.
extern "C" __global__ void rnb_amp_unscale(float* g, rnb_i64 n, const float* scale) {
    float inv = (float)(1.0 / (double)scale[0]);
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x)
        g[k] = g[k] * inv;
}

// GradScaler.update after the NaN check (one thread): a flagged step backs the scale off and restarts the
// count; ``interval`` clean steps in a row grow it, kept only if finite.
extern "C" __global__ void rnb_amp_update_scale(const rnb_i64* flag, float* scale, rnb_i64* count, float growth,
                                                float backoff, rnb_i64 interval) {
    if (flag[0]) {
        scale[0] = scale[0] * backoff;
        count[0] = 0;
        return;
    }
    count[0] += 1;
    if (count[0] == interval) {
        float grown = scale[0] * growth;
        if (grown - grown == 0.0f) scale[0] = grown;
        count[0] = 0;
    }
}

// fc_fwd_lowp's epilogue: y = round(act(sums + b)) from the fp32 sums GemmEx wrote (rows ``lds`` and
// ``ldy`` apart: padded rows), the fp32 kernels' bias and activation, then one rounding.
extern "C" __global__ void rnb_lowp_bias_act(const float* sums, rnb_i64 lds, const float* b, int has_b, int act,
                                             double slope, void* y, int fmt, rnb_i64 ldy, rnb_i64 rows, rnb_i64 cols) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < rows * cols;
         k += (rnb_i64)gridDim.x * blockDim.x) {
        rnb_i64 r = k / cols, c = k % cols;
        float z = sums[r * lds + c];
        if (has_b) z = z + b[c];
        rnb_store(y, fmt, r * ldy + c, rnb_bias_act(z, act, slope));
    }
}

// fc_bwd_lowp's prologue: dz = float(dy) * act'(float(y)) in fp32 (the bias gradient's operand) and, with an
// activation, dy = round(dz) (the products read it, as a 16-bit backward does); act 0: dz = float(dy).
extern "C" __global__ void rnb_lowp_act_grad(unsigned short* dy, int fmt, rnb_i64 ld_dy, const unsigned short* y,
                                             rnb_i64 ld_y, float* dz, rnb_i64 ld_dz, rnb_i64 rows, rnb_i64 cols,
                                             int act, double slope) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < rows * cols;
         k += (rnb_i64)gridDim.x * blockDim.x) {
        rnb_i64 r = k / cols, c = k % cols;
        float d = rnb_load(dy, fmt, r * ld_dy + c);
        if (act) {
            d = rnb_act_grad_from_output(d, rnb_load(y, fmt, r * ld_y + c), act, slope);
            rnb_store(dy, fmt, r * ld_dy + c, d);
        }
        dz[r * ld_dz + c] = d;
    }
}
