// renaissance_nb: the GPU kernels of image models (conv, batch norm, pooling, global average
// pooling, flatten). Feature maps are channels-last (N, H, W, C) in the arena, as on the CPU.
//
// Every element-wise or gather kernel computes what the CPU kernel (kernels/conv.py) computes, in
// the same order and the same precision, so its bytes are the CPU's: col2im and the max-pool
// gradient are written as gathers that add an element's contributions in the order the CPU
// scatter adds them. Per-channel sums over all rows (batch norm statistics, bias gradients) are
// two fixed passes, never atomics: each thread sums one (slice of rows, channel) in float64, then
// one thread per channel adds the slices in order; two runs give the same bytes (the CPU sums the
// rows in one sweep, so these sums agree with it to float64 rounding).

RNB_HD float rnb_neg_inf() {  // -inf without math headers (NVRTC has none)
    union { rnb_u32 u; float f; } v;
    v.u = 0xff800000u;
    return v.f;
}

#define RNB_GRID_STRIDE(k, n) \
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < (n); k += (rnb_i64)gridDim.x * blockDim.x)

// cols[r, (i*k + j)*c + q] = x[n, oh*s-p+i, ow*s-p+j, q] (0 outside), r = (n*Ho + oh)*Wo + ow.
extern "C" __global__ void rnb_im2col(const float* x, float* cols, int n, int h, int w, int c, int k, int s, int p,
                                      int ho, int wo) {
    rnb_i64 kkc = (rnb_i64)k * k * c;
    RNB_GRID_STRIDE(e, (rnb_i64)n * ho * wo * kkc) {
        rnb_i64 r = e / kkc;
        int t = (int)(e % kkc);
        int q = t % c, j = (t / c) % k, i = t / (k * c);
        int ow = (int)(r % wo), oh = (int)((r / wo) % ho);
        rnb_i64 b = r / ((rnb_i64)wo * ho);
        int ih = oh * s - p + i, iw = ow * s - p + j;
        cols[e] = (ih >= 0 && ih < h && iw >= 0 && iw < w) ? x[((b * h + ih) * w + iw) * c + q] : 0.0f;
    }
}

// An (N, H, W, C) element index split into its sample, row, column and channel.
RNB_HD void rnb_nhwc(rnb_i64 e, int h, int w, int c, rnb_i64* b, int* ih, int* iw, int* q) {
    *q = (int)(e % c);
    *iw = (int)((e / c) % w);
    *ih = (int)((e / ((rnb_i64)c * w)) % h);
    *b = e / ((rnb_i64)c * w * h);
}

// Input rows [lo, hi) that output position o's window covers (padding clipped), as the CPU's window_.
RNB_HD void rnb_window(int o, int s, int p, int k, int n, int* lo, int* hi) {
    int start = o * s - p;
    *lo = start > 0 ? start : 0;
    *hi = start + k < n ? start + k : n;
}

// The output positions whose window (start o*s - p, length k) covers input index i, as [lo, hi].
RNB_HD void rnb_covering(int i, int s, int p, int k, int n_out, int* lo, int* hi) {
    int a = i + p - k + 1;  // o*s >= a
    *lo = a <= 0 ? 0 : (a + s - 1) / s;
    int b = (i + p) / s;    // o*s <= i + p
    *hi = b < n_out - 1 ? b : n_out - 1;
}

// dx[n, ih, iw, q] = sum of dcols over the patches that copied it, in the CPU scatter's order.
extern "C" __global__ void rnb_col2im(const float* dcols, float* dx, int n, int h, int w, int c, int k, int s, int p,
                                      int ho, int wo) {
    rnb_i64 kkc = (rnb_i64)k * k * c;
    RNB_GRID_STRIDE(e, (rnb_i64)n * h * w * c) {
        rnb_i64 b;
        int ih, iw, q;
        rnb_nhwc(e, h, w, c, &b, &ih, &iw, &q);
        int oh0, oh1, ow0, ow1;
        rnb_covering(ih, s, p, k, ho, &oh0, &oh1);
        rnb_covering(iw, s, p, k, wo, &ow0, &ow1);
        float acc = 0.0f;
        for (int oh = oh0; oh <= oh1; ++oh) {
            int i = ih - (oh * s - p);
            for (int ow = ow0; ow <= ow1; ++ow) {
                int j = iw - (ow * s - p);
                rnb_i64 r = (b * ho + oh) * wo + ow;
                acc += dcols[r * kkc + (i * k + j) * c + q];
            }
        }
        dx[e] = acc;
    }
}

RNB_HD rnb_i64 rnb_slice_start(rnb_i64 m, int slices, int s) { return m * s / slices; }

// Pass 1 of a column sum: part[s*c + j] = sum of d[i, j] over the rows i of slice s (float64).
// With act (ReLU), d[i, j] = 0 where y[i, j] <= 0 first, in place (the conv bias-gradient input).
extern "C" __global__ void rnb_colsum_part(float* d, const float* y, rnb_i64 m, int c, int slices, int act,
                                           double* part) {
    RNB_GRID_STRIDE(t, (rnb_i64)slices * c) {
        int j = (int)(t % c), sl = (int)(t / c);
        double acc = 0.0;
        for (rnb_i64 i = rnb_slice_start(m, slices, sl); i < rnb_slice_start(m, slices, sl + 1); ++i) {
            float g = d[i * c + j];
            if (act == 1) {
                g = y[i * c + j] > 0.0f ? g : 0.0f;
                d[i * c + j] = g;
            }
            acc += (double)g;
        }
        part[t] = acc;
    }
}

// Pass 2: out[j] = sum over the slices in order (a float32 output, as the CPU's float64 sum stored).
extern "C" __global__ void rnb_colsum_final(const double* part, int c, int slices, float* out) {
    RNB_GRID_STRIDE(j, (rnb_i64)c) {
        double acc = 0.0;
        for (int sl = 0; sl < slices; ++sl) acc += part[(rnb_i64)sl * c + j];
        out[j] = (float)acc;
    }
}

// Batch-norm statistics, pass 1: shifted sums sum(x - x0) and sum((x - x0)^2) per slice, x0 = row 0.
extern "C" __global__ void rnb_bn_stats_part(const float* x, rnb_i64 m, int c, int slices, double* part) {
    RNB_GRID_STRIDE(t, (rnb_i64)slices * c) {
        int j = (int)(t % c), sl = (int)(t / c);
        double x0 = (double)x[j], s1 = 0.0, s2 = 0.0;
        for (rnb_i64 i = rnb_slice_start(m, slices, sl); i < rnb_slice_start(m, slices, sl + 1); ++i) {
            double d = (double)x[i * c + j] - x0;
            s1 += d;
            s2 += d * d;
        }
        part[(rnb_i64)sl * 2 * c + j] = s1;
        part[(rnb_i64)sl * 2 * c + c + j] = s2;
    }
}

// Pass 2: mean, 1/std, PyTorch's running statistics, and the per-channel affine a, b (float32, as
// the CPU's scratch) that the element pass applies: y = act(x*a + b).
extern "C" __global__ void rnb_bn_stats_final(const double* part, const float* x, const float* gamma,
                                              const float* beta, rnb_i64 m, int c, int slices, double momentum,
                                              double eps, float* mean, float* invstd, float* rmean, float* rvar,
                                              float* aff) {
    RNB_GRID_STRIDE(j, (rnb_i64)c) {
        double s1 = 0.0, s2 = 0.0;
        for (int sl = 0; sl < slices; ++sl) {
            s1 += part[(rnb_i64)sl * 2 * c + j];
            s2 += part[(rnb_i64)sl * 2 * c + c + j];
        }
        double inv_m = 1.0 / (double)m;
        double unbias = (double)m / ((double)m - 1.0);  // m >= 2: the binding checks it
        double ms = s1 * inv_m;
        double var = s2 * inv_m - ms * ms;
        if (var < 0.0) var = 0.0;
        double mu = (double)x[j] + ms;
        double istd = 1.0 / sqrt(var + eps);
        mean[j] = (float)mu;
        invstd[j] = (float)istd;
        if (isfinite(mu) && isfinite(var)) {  // a non-finite batch (the NaN guard skips its update) keeps them
            rmean[j] = (float)((1.0 - momentum) * (double)rmean[j] + momentum * mu);
            rvar[j] = (float)((1.0 - momentum) * (double)rvar[j] + momentum * (var * unbias));
        }
        double a = (double)gamma[j] * istd;
        aff[j] = (float)a;
        aff[c + j] = (float)((double)beta[j] - mu * a);
    }
}

// y = act(x*a + b) per channel, in float32 (training BN's second half, and inference BN).
extern "C" __global__ void rnb_channel_affine(const float* x, float* y, const float* a, const float* b, rnb_i64 m,
                                              int c, int act) {
    RNB_GRID_STRIDE(e, m * c) {
        int j = (int)(e % c);
        float z = x[e] * a[j] + b[j];
        y[e] = (act == 1 && !(z > 0.0f)) ? 0.0f : z;
    }
}

// Batch-norm gradient, pass 1: with act, dy = 0 where y <= 0 (in place); then per slice
// sum(dy) and sum(dy * (x - mean)) in float64.
extern "C" __global__ void rnb_bn_grad_part(float* dy, const float* x, const float* y, const float* mean, rnb_i64 m,
                                            int c, int slices, int act, double* part) {
    RNB_GRID_STRIDE(t, (rnb_i64)slices * c) {
        int j = (int)(t % c), sl = (int)(t / c);
        double mu = (double)mean[j], s1 = 0.0, s2 = 0.0;
        for (rnb_i64 i = rnb_slice_start(m, slices, sl); i < rnb_slice_start(m, slices, sl + 1); ++i) {
            float g = dy[i * c + j];
            if (act == 1) {
                g = y[i * c + j] > 0.0f ? g : 0.0f;
                dy[i * c + j] = g;
            }
            double gd = (double)g;
            s1 += gd;
            s2 += gd * ((double)x[i * c + j] - mu);
        }
        part[(rnb_i64)sl * 2 * c + j] = s1;
        part[(rnb_i64)sl * 2 * c + c + j] = s2;
    }
}

// Pass 2: dbeta, dgamma, and the coefficients of dx = a*dy + b*(x - mean) + k (float64, as the CPU's).
extern "C" __global__ void rnb_bn_grad_final(const double* part, const float* gamma, const float* invstd, rnb_i64 m,
                                             int c, int slices, float* dgamma, float* dbeta, double* aff) {
    RNB_GRID_STRIDE(j, (rnb_i64)c) {
        double sdy = 0.0, sdyx = 0.0;
        for (int sl = 0; sl < slices; ++sl) {
            sdy += part[(rnb_i64)sl * 2 * c + j];
            sdyx += part[(rnb_i64)sl * 2 * c + c + j];
        }
        double inv_m = 1.0 / (double)m;
        double istd = (double)invstd[j];
        dbeta[j] = (float)sdy;
        dgamma[j] = (float)(sdyx * istd);
        double a = (double)gamma[j] * istd;
        aff[j] = a;
        aff[c + j] = -a * istd * istd * sdyx * inv_m;
        aff[2 * c + j] = -a * sdy * inv_m;
    }
}

extern "C" __global__ void rnb_bn_dx(const float* dy, const float* x, const float* mean, const double* aff, float* dx,
                                     rnb_i64 m, int c) {
    RNB_GRID_STRIDE(e, m * c) {
        int j = (int)(e % c);
        float centered = x[e] - mean[j];
        dx[e] = (float)(aff[j] * (double)dy[e] + aff[c + j] * (double)centered + aff[2 * c + j]);
    }
}

// Inference batch norm as an affine: scale = g/sqrt(rv+eps), bias = b - rm*scale (float64, stored float32).
extern "C" __global__ void rnb_bn_fold(const float* gamma, const float* beta, const float* rmean, const float* rvar,
                                       double eps, int c, float* scale, float* bias) {
    RNB_GRID_STRIDE(j, (rnb_i64)c) {
        double sc = (double)gamma[j] / sqrt((double)rvar[j] + eps);
        scale[j] = (float)sc;
        bias[j] = (float)((double)beta[j] - (double)rmean[j] * sc);
    }
}

// Max pooling: the window's max (-inf padding; NaN wins) and the first index ih*W + iw that holds it.
// bn_relu != 0: x is a batch norm's input and aa its (2, C) affine; the window's values are rnb_channel_affine's
// with act = 1, the batch norm's output, which is then never written (ops/pool.py relu_pool_pairs).
extern "C" __global__ void rnb_maxpool_fwd(const float* x, const float* aa, float* y, int* am, int n, int h, int w,
                                           int c, int k, int s, int p, int ho, int wo, int bn_relu) {
    RNB_GRID_STRIDE(e, (rnb_i64)n * ho * wo * c) {
        rnb_i64 b;
        int oh, ow, q;
        rnb_nhwc(e, ho, wo, c, &b, &oh, &ow, &q);
        int hs, he, ws, we;
        rnb_window(oh, s, p, k, h, &hs, &he);
        rnb_window(ow, s, p, k, w, &ws, &we);
        float best = rnb_neg_inf();
        int arg = hs * w + ws;
        for (int ih = hs; ih < he; ++ih)
            for (int iw = ws; iw < we; ++iw) {
                float v = x[((b * h + ih) * w + iw) * c + q];
                if (bn_relu) {
                    float z = v * aa[q] + aa[c + q];
                    v = (z > 0.0f) ? z : 0.0f;
                }
                if (v > best || v != v) {
                    best = v;
                    arg = ih * w + iw;
                }
            }
        y[e] = best;
        am[e] = arg;
    }
}

// Its gradient as a gather: dx gets dy of every window whose argmax it is, in the CPU scatter's order.
// relu != 0: py is the forward's output, and a window whose max is not above 0 passes no gradient (the
// gradient of a ReLU fused into the layer before the pool: ops/pool.py relu_through_pool).
extern "C" __global__ void rnb_maxpool_bwd(const float* dy, const int* am, const float* py, float* dx, int n, int h,
                                           int w, int c, int k, int s, int p, int ho, int wo, int relu) {
    RNB_GRID_STRIDE(e, (rnb_i64)n * h * w * c) {
        rnb_i64 b;
        int ih, iw, q;
        rnb_nhwc(e, h, w, c, &b, &ih, &iw, &q);
        int oh0, oh1, ow0, ow1;
        rnb_covering(ih, s, p, k, ho, &oh0, &oh1);
        rnb_covering(iw, s, p, k, wo, &ow0, &ow1);
        int me = ih * w + iw;
        float acc = 0.0f;
        for (int oh = oh0; oh <= oh1; ++oh)
            for (int ow = ow0; ow <= ow1; ++ow) {
                rnb_i64 o = ((b * ho + oh) * wo + ow) * c + q;
                if (am[o] == me && (!relu || py[o] > 0.0f)) acc += dy[o];
            }
        dx[e] = acc;
    }
}

// Global average pooling: y[n, q] = (sum over H*W in float32, in order) / (H*W); and its gradient.
extern "C" __global__ void rnb_gap_fwd(const float* x, float* y, int n, int hw, int c, float div) {
    RNB_GRID_STRIDE(e, (rnb_i64)n * c) {
        int q = (int)(e % c);
        rnb_i64 b = e / c;
        float acc = 0.0f;
        for (int t = 0; t < hw; ++t) acc += x[(b * hw + t) * c + q];
        y[e] = acc / div;
    }
}

extern "C" __global__ void rnb_gap_bwd(const float* dy, float* dx, int n, int hw, int c, float div) {
    RNB_GRID_STRIDE(e, (rnb_i64)n * hw * c) {
        int q = (int)(e % c);
        rnb_i64 b = e / ((rnb_i64)hw * c);
        dx[e] = dy[b * c + q] / div;
    }
}

// flatten of (N, H, W, C) features in PyTorch's (C, H, W) order, and back (the gradient).
extern "C" __global__ void rnb_nhwc_to_nchw(const float* src, float* dst, int n, int h, int w, int c, int to_nchw) {
    RNB_GRID_STRIDE(e, (rnb_i64)n * h * w * c) {
        rnb_i64 b;
        int ih, iw, q;
        rnb_nhwc(e, h, w, c, &b, &ih, &iw, &q);
        rnb_i64 chw = ((b * c + q) * h + ih) * w + iw;
        if (to_nchw) dst[chw] = src[e];
        else dst[e] = src[chw];
    }
}

// Average pooling: (sum of the window's inside values, in order) / k^2, padding counting as zeros;
// its gradient as a gather of dy / k^2 over the covering windows, in the CPU scatter's order.
extern "C" __global__ void rnb_avgpool_fwd(const float* x, float* y, int n, int h, int w, int c, int k, int s, int p,
                                           int ho, int wo, float kk) {
    RNB_GRID_STRIDE(e, (rnb_i64)n * ho * wo * c) {
        rnb_i64 b;
        int oh, ow, q;
        rnb_nhwc(e, ho, wo, c, &b, &oh, &ow, &q);
        int hs, he, ws, we;
        rnb_window(oh, s, p, k, h, &hs, &he);
        rnb_window(ow, s, p, k, w, &ws, &we);
        float acc = 0.0f;
        for (int ih = hs; ih < he; ++ih)
            for (int iw = ws; iw < we; ++iw) acc += x[((b * h + ih) * w + iw) * c + q];
        y[e] = acc / kk;
    }
}

extern "C" __global__ void rnb_avgpool_bwd(const float* dy, float* dx, int n, int h, int w, int c, int k, int s, int p,
                                           int ho, int wo, float kk) {
    RNB_GRID_STRIDE(e, (rnb_i64)n * h * w * c) {
        rnb_i64 b;
        int ih, iw, q;
        rnb_nhwc(e, h, w, c, &b, &ih, &iw, &q);
        int oh0, oh1, ow0, ow1;
        rnb_covering(ih, s, p, k, ho, &oh0, &oh1);
        rnb_covering(iw, s, p, k, wo, &ow0, &ow1);
        float acc = 0.0f;
        for (int oh = oh0; oh <= oh1; ++oh)
            for (int ow = ow0; ow <= ow1; ++ow) acc += dy[((b * ho + oh) * wo + ow) * c + q] / kk;
        dx[e] = acc;
    }
}
