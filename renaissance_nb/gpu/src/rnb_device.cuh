// renaissance_nb: per-element device functions of the GPU kernels.
//
// Everything here is plain C++ marked RNB_HD, so the same source compiles
// three ways: by NVRTC inside CuPy (the real kernels in rnb_kernels.cu call
// these), by nvcc for a compile check, and by g++ into a small CPU harness that
// the test suite runs on machines without a GPU, comparing every function with
// the NumPy/numba kernels of the CPU backend. No standard headers under NVRTC.
//
// Floating point: the kernels are compiled with --fmad=false and the
// expressions below keep the CPU kernels' operation order, so the float32
// element-wise results (optimizer, EMA, masks, ReLU) are the CPU's bit for bit.
#ifndef RNB_DEVICE_CUH
#define RNB_DEVICE_CUH

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define RNB_HD __host__ __device__ __forceinline__
#else
#include <math.h>
#define RNB_HD static inline
#endif

typedef unsigned int rnb_u32;
typedef unsigned long long rnb_u64;
typedef long long rnb_i64;

// ---- Philox4x32-10 (Random123), the CPU backend's counter layout ------------------------
// key = (seed lo, seed hi); counter of block b = (b lo, b hi, stream, 0).
RNB_HD void rnb_philox(rnb_u32 c[4], rnb_u32 k0, rnb_u32 k1) {
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        rnb_u64 p0 = (rnb_u64)0xD2511F53u * (rnb_u64)c[0];
        rnb_u64 p1 = (rnb_u64)0xCD9E8D57u * (rnb_u64)c[2];
        rnb_u32 n0 = (rnb_u32)(p1 >> 32) ^ c[1] ^ k0;
        rnb_u32 n1 = (rnb_u32)p1;
        rnb_u32 n2 = (rnb_u32)(p0 >> 32) ^ c[3] ^ k1;
        rnb_u32 n3 = (rnb_u32)p0;
        c[0] = n0; c[1] = n1; c[2] = n2; c[3] = n3;
    }
}

// The four 32-bit words of block `block` of (seed, stream).
RNB_HD void rnb_philox_block(rnb_u64 seed, rnb_u32 stream, rnb_u64 block, rnb_u32 out[4]) {
    out[0] = (rnb_u32)block;
    out[1] = (rnb_u32)(block >> 32);
    out[2] = stream;
    out[3] = 0u;
    rnb_philox(out, (rnb_u32)seed, (rnb_u32)(seed >> 32));
}

// Uniform in [0, 1) from the top 24 bits: exact in float32.
RNB_HD float rnb_u24(rnb_u32 w) { return (float)(w >> 8) * 5.9604644775390625e-08f; }

// Inverted-dropout mask value: scale where u < keep, else 0 (the comparison in float32).
RNB_HD float rnb_dropout_mask(rnb_u32 w, float keep, float scale) { return rnb_u24(w) < keep ? scale : 0.0f; }

// ---- activations ------------------------------------------------------------------------------
// codes: 0 none, 1 relu, 2 tanh, 3 sigmoid, 4 leaky_relu, 5 silu, 6 gelu (the CPU's ACT_CODES)
#define RNB_INV_SQRT2 0.70710678118654757
#define RNB_INV_SQRT_2PI 0.3989422804014327

// Fused bias+activation of fc_fwd: z = y + b, then act (relu/tanh/sigmoid/leaky as the CPU's bias_act_).
// Leaky products are formed in double and rounded once to float32, as the CPU kernels do.
RNB_HD float rnb_bias_act(float z, int act, double slope) {
    if (act == 1) return z < 0.0f ? 0.0f : z;
    if (act == 2) return (float)tanh((double)z);
    if (act == 3) return (float)(1.0 / (1.0 + exp(-(double)z)));
    if (act == 4) return z < 0.0f ? (float)((double)z * slope) : z;
    return z;
}

// dy * act'(z) written with the output y (fc_bwd of a fused layer).
RNB_HD float rnb_act_grad_from_output(float d, float y, int act, double slope) {
    if (act == 1) return y <= 0.0f ? 0.0f : d;
    if (act == 2) return d * (1.0f - y * y);
    if (act == 3) return d * (y * (1.0f - y));
    if (act == 4) return y <= 0.0f ? (float)((double)d * slope) : d;
    return d;
}

// Stand-alone activation (any code), computed in double as the CPU's act_forward.
RNB_HD float rnb_act_forward(float x, int act, double slope) {
    double z = (double)x;
    double r;
    if (act == 1) r = z > 0.0 ? z : 0.0;
    else if (act == 2) r = tanh(z);
    else if (act == 3) r = 1.0 / (1.0 + exp(-z));
    else if (act == 4) r = z > 0.0 ? z : z * slope;
    else if (act == 5) r = z / (1.0 + exp(-z));
    else if (act == 6) r = 0.5 * z * (1.0 + erf(z * RNB_INV_SQRT2));
    else r = z;
    return (float)r;
}

RNB_HD float rnb_act_backward(float d, float x, int act, double slope) {
    double z = (double)x;
    double g;
    if (act == 1) g = z > 0.0 ? 1.0 : 0.0;
    else if (act == 2) { double t = tanh(z); g = 1.0 - t * t; }
    else if (act == 3) { double s = 1.0 / (1.0 + exp(-z)); g = s * (1.0 - s); }
    else if (act == 4) g = z > 0.0 ? 1.0 : slope;
    else if (act == 5) { double s = 1.0 / (1.0 + exp(-z)); g = s * (1.0 + z * (1.0 - s)); }
    else if (act == 6) g = 0.5 * (1.0 + erf(z * RNB_INV_SQRT2)) + z * RNB_INV_SQRT_2PI * exp(-0.5 * z * z);
    else g = 1.0;
    return (float)((double)d * g);
}

// Whether logit z of class j comes before the true class's zy (class y) in argmax/top-k order: NaN
// above every number (argmax returns the first NaN's index), equal values by lower index. As the CPU's
// fused.ranks_ahead.
RNB_HD bool rnb_ranks_ahead(float z, int j, float zy, int y) {
    if (z != z) return zy == zy || j < y;
    return z > zy || (z == zy && j < y);
}

// ---- softmax cross-entropy of one row, with label smoothing and the rank of the true class ----
// Returns the row's loss (double); *better = how many logits come before the true one
// (rnb_ranks_ahead). With dlogits != 0 writes the loss's gradient times inv_n. With class weights
// (weight != 0; wsum their sum) the loss and gradient are torch's weight= ones, before the division
// by the batch's summed target weights that inv_n holds. Same formulas and order as the CPU.
RNB_HD double rnb_xent_row(const float* row, int c, int y, double smoothing, double inv_n, const float* weight,
                           double wsum, float* dlogits, int* better) {
    float mx = row[0];
    for (int j = 1; j < c; ++j)
        if (row[j] > mx) mx = row[j];
    double s = 0.0;
    for (int j = 0; j < c; ++j) s += exp((double)row[j] - (double)mx);
    double lse = (double)mx + log(s);
    double off = smoothing / (double)c;
    double on = 1.0 - smoothing;
    double loss, wy = 0.0;
    if (weight) {
        wy = (double)weight[y];
        double wz = 0.0;
        for (int j = 0; j < c; ++j) wz += (double)weight[j] * (double)row[j];
        loss = on * wy * (lse - (double)row[y]) + off * (wsum * lse - wz);
    } else {
        double zsum = 0.0;
        for (int j = 0; j < c; ++j) zsum += (double)row[j];
        loss = on * (lse - (double)row[y]) + off * ((double)c * lse - zsum);
    }
    float zy = row[y];
    int b = 0;
    for (int j = 0; j < c; ++j)
        if (rnb_ranks_ahead(row[j], j, zy, y)) ++b;
    *better = b;
    if (dlogits) {
        for (int j = 0; j < c; ++j) {
            double p = exp((double)row[j] - lse);
            double d = weight ? on * wy * (p - (j == y ? 1.0 : 0.0)) + off * (p * wsum - (double)weight[j])
                              : p - (off + (j == y ? on : 0.0));
            dlogits[j] = (float)(d * inv_n);
        }
    }
    return loss;
}

// ---- optimizer ---------------------------------------------------------------------------------
// a ** e by squaring, as numba computes float ** int (bit-identical bias corrections).
RNB_HD double rnb_ipow(double a, rnb_i64 e) {
    if (e > 0x10000) return pow(a, (double)e);
    double r = 1.0;
    while (e != 0) {
        if (e & 1) r *= a;
        e >>= 1;
        a *= a;
    }
    return r;
}

// Per-step scalars of Adam/AdamW for finished-step count t (1-based) and learning rate lr.
// m is torch's exp_avg.lerp_(grad, 1 - beta1): m + (g - m) * (1 - beta1), or, when 1 - beta1 >= 0.5
// (from_end), g - (g - m) * lerp_w with lerp_w = 1 - (1 - beta1) in float: ATen's two lerp formulas
// (its vectorised CPU code fuses them into multiply-adds; here, as on our CPU, they are not fused).
struct RnbAdamScalars {
    float step_size, bc2, decay, wd, b2, lerp_w, one_b2, eps;
    int from_end;
};

RNB_HD RnbAdamScalars rnb_adam_scalars(double lr, rnb_i64 t, double beta1, double beta2, double eps,
                                       double weight_decay) {
    RnbAdamScalars s;
    double bc1 = 1.0 - rnb_ipow(beta1, t);
    double bc2_sqrt = sqrt(1.0 - rnb_ipow(beta2, t));
    s.step_size = (float)(lr / bc1);
    s.bc2 = (float)bc2_sqrt;
    s.decay = (float)(1.0 - lr * weight_decay);
    s.wd = (float)weight_decay;
    s.b2 = (float)beta2;
    float one_b1 = (float)(1.0 - beta1);
    s.from_end = !(fabsf(one_b1) < 0.5f);
    s.lerp_w = s.from_end ? 1.0f - one_b1 : one_b1;
    s.one_b2 = (float)(1.0 - beta2);
    s.eps = (float)eps;
    return s;
}

// Optimizer state below the smallest normal float is stored as 0, as on the CPU (TINY32 in
// kernels/fused.py: subnormals are slow there); NaN and inf are kept. Same bytes on both backends.
RNB_HD float rnb_flush(float x) { return fabsf(x) < 1.17549435082228750797e-38f ? 0.0f : x; }

// One element of PyTorch's Adam (decoupled=0) or AdamW (decoupled=1).
RNB_HD void rnb_adam_elem(float* w, float g, float* m, float* v, const RnbAdamScalars s, int decoupled,
                          int has_wd, int maximize) {
    float gk = maximize ? -g : g;
    float wk = *w;
    if (decoupled) wk = wk * s.decay;
    else if (has_wd) gk = gk + s.wd * wk;
    float mk = rnb_flush(s.from_end ? gk - (gk - *m) * s.lerp_w : *m + (gk - *m) * s.lerp_w);
    float vk = rnb_flush(*v * s.b2 + s.one_b2 * gk * gk);
    *m = mk;
    *v = vk;
    float denom = sqrtf(vk) / s.bc2 + s.eps;
    *w = wk - s.step_size * (mk / denom);
}

// One element of PyTorch's SGD (first: the momentum buffer starts as the gradient).
RNB_HD void rnb_sgd_elem(float* w, float g, float* m, float lr, int first, float momentum, float one_damp, float wd,
                         int has_wd, int use_m, int nesterov, int maximize) {
    float gk = maximize ? -g : g;
    if (has_wd) gk = gk + wd * *w;
    if (use_m) {
        float buf = rnb_flush(first ? gk : momentum * *m + one_damp * gk);
        *m = buf;
        gk = nesterov ? gk + momentum * buf : buf;
    }
    *w = *w - lr * gk;
}

// EMA decay with warm-up: min(decay, (1 + t) / (10 + t)), t = finished steps (in double; the
// kernels use (float)d and (float)(1 - d), as the CPU does).
RNB_HD double rnb_ema_decay(double decay, rnb_i64 t) {
    double d = (1.0 + (double)t) / (10.0 + (double)t);
    return d < decay ? d : decay;
}

RNB_HD float rnb_ema_elem(float e, float w, float d, float one_d) { return d * e + one_d * w; }

#endif  // RNB_DEVICE_CUH
