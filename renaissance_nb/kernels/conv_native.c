/* The conv net's memory passes in C: batch norm, pooling, global average pooling, im2col / col2im,
 * ReLU, the image batch gather and the dropout mask; the twins of conv_loops.py, conv_par.py,
 * fused.relu_chunks_, augment.gather_images_nhwc and philox.dropout_kernel (kernels/conv_native.py
 * binds them; tests/test_conv_native.py compares their bytes).
 *
 * As native.c: the same types at every step as numba's (float32 where numba keeps float32, double
 * where a float64 operand or literal widens), the same order of additions, the same cuts of a range;
 * built with -ffp-contract=off. Threads: OpenMP over fixed blocks (images, or RNB_CHUNKS row blocks),
 * each block's values independent of the thread that computes it. Feature maps are NHWC float32,
 * 2-D views (rows, C) take a row stride in elements. Nothing here allocates.
 */
#include "native.h"

/* ---- batch norm (conv_loops.bn_*_, conv_par.bn_train_*_par_) ------------------------------------ */
static inline i64 cut8(i64 m, i64 chunks, i64 t) { /* conv_par._cut8 */
    return min64(m, (cut(m, chunks, t) + 7) / 8 * 8);
}

/* conv_loops.bn_shifted_sums_: eight-row blocks summed pairwise in float32, block sums in double */
static void bn_shifted_sums(const float *x, i64 ldx, i64 c, const float *x0, double *a1, double *a2, i64 r0, i64 r1) {
    for (i64 j = 0; j < c; j++) { a1[j] = 0.0; a2[j] = 0.0; }
    i64 i = r0;
    for (; i + 8 <= r1; i += 8) {
        const float *p0 = x + i * ldx, *p1 = p0 + ldx, *p2 = p1 + ldx, *p3 = p2 + ldx;
        const float *p4 = p3 + ldx, *p5 = p4 + ldx, *p6 = p5 + ldx, *p7 = p6 + ldx;
        for (i64 j = 0; j < c; j++) {
            float z = x0[j];
            float d0 = p0[j] - z, d1 = p1[j] - z, d2 = p2[j] - z, d3 = p3[j] - z;
            float d4 = p4[j] - z, d5 = p5[j] - z, d6 = p6[j] - z, d7 = p7[j] - z;
            a1[j] += (double)(((d0 + d1) + (d2 + d3)) + ((d4 + d5) + (d6 + d7)));
            a2[j] += (double)(((d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3)) + ((d4 * d4 + d5 * d5) + (d6 * d6 + d7 * d7)));
        }
    }
    for (i64 r = i; r < r1; r++) {
        const float *p0 = x + r * ldx;
        for (i64 j = 0; j < c; j++) {
            float d0 = p0[j] - x0[j];
            a1[j] += (double)d0;
            a2[j] += (double)(d0 * d0);
        }
    }
}

/* fused.fold_blocks over both sums: acc[k][j] = sum over t of parts[t][k][j], t in order */
static void fold_parts(const double *parts, i64 chunks, i64 c, double *acc) {
    for (i64 k = 0; k < 2; k++)
        for (i64 j = 0; j < c; j++) {
            double s = 0.0;
            for (i64 t = 0; t < chunks; t++) s += parts[(t * 2 + k) * c + j];
            acc[k * c + j] = s;
        }
}

/* conv_loops.channel_affine_: y = act(x * a + b) per channel (float32), act 1 = relu */
static void channel_affine(const float *x, i64 ldx, float *y, i64 ldy, i64 c, const float *a, const float *b, i64 act,
                           i64 r0, i64 r1) {
    for (i64 i = r0; i < r1; i++) {
        const float *xr = x + i * ldx;
        float *yr = y + i * ldy;
        if (act == 1) {
            for (i64 j = 0; j < c; j++) { float z = xr[j] * a[j] + b[j]; yr[j] = z > 0 ? z : 0.0f; }
        } else {
            for (i64 j = 0; j < c; j++) yr[j] = xr[j] * a[j] + b[j];
        }
    }
}

/* conv_loops.bn_train_fwd_finish_ */
static void bn_fwd_finish(const float *x0, i64 m, i64 c, const float *gamma, const float *beta, float *mean,
                          float *invstd, float *rmean, float *rvar, double momentum, double eps, const double *acc,
                          float *aff) {
    double inv_m = 1.0 / (double)m;
    double unbias = m > 1 ? (double)m / ((double)m - 1.0) : NAN;
    for (i64 j = 0; j < c; j++) {
        double ms = acc[j] * inv_m;
        double var = acc[c + j] * inv_m - ms * ms;
        if (var < 0.0) var = 0.0;
        double mu = (double)x0[j] + ms;
        double istd = 1.0 / sqrt(var + eps);
        mean[j] = (float)mu;
        invstd[j] = (float)istd;
        if (isfinite(mu) && isfinite(var)) {
            rmean[j] = (float)((1.0 - momentum) * (double)rmean[j] + momentum * mu);
            rvar[j] = (float)((1.0 - momentum) * (double)rvar[j] + momentum * (var * unbias));
        }
        double a = (double)gamma[j] * istd;
        aff[j] = (float)a;
        aff[c + j] = (float)((double)beta[j] - mu * a);
    }
}

/* conv_par.bn_train_fwd_par_ (chunks = RNB_CHUNKS) or conv_loops.bn_train_fwd_ (chunks = 1: the one-pass
 * sums, folded into acc as 0.0 + s, which is s): acc (2, C), parts (chunks, 2, C) double, aff (2, C) */
void rnb_bn_fwd(const float *x, i64 m, i64 c, i64 ldx, const float *gamma, const float *beta, float *y, i64 ldy,
                float *mean, float *invstd, float *rmean, float *rvar, double momentum, double eps, i64 act,
                double *acc, float *aff, double *parts, i64 chunks, int threads) {
    threads = team(threads);
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (i64 t = 0; t < chunks; t++)
        bn_shifted_sums(x, ldx, c, x, parts + t * 2 * c, parts + (t * 2 + 1) * c, cut8(m, chunks, t),
                        cut8(m, chunks, t + 1));
    fold_parts(parts, chunks, c, acc);
    bn_fwd_finish(x, m, c, gamma, beta, mean, invstd, rmean, rvar, momentum, eps, acc, aff);
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (i64 t = 0; t < chunks; t++)
        channel_affine(x, ldx, y, ldy, c, aff, aff + c, act, cut(m, chunks, t), cut(m, chunks, t + 1));
}

/* conv_loops.bn_grad_sums_: dy *= (y > 0) with a fused relu, in place; s1 = sum dy, s2 = sum dy (x - mean) */
static void bn_grad_sums(float *dy, i64 ldd, const float *x, i64 ldx, const float *y, i64 ldy, const float *mean,
                         i64 c, i64 act, double *a1, double *a2, i64 r0, i64 r1) {
    for (i64 j = 0; j < c; j++) { a1[j] = 0.0; a2[j] = 0.0; }
    for (i64 i = r0; i < r1;) {
        i64 e = min64(r1, i + 8);
        if (act == 1)
            for (i64 r = i; r < e; r++) {
                float *dr = dy + r * ldd;
                const float *yr = y + r * ldy;
                for (i64 j = 0; j < c; j++)
                    if (!(yr[j] > 0)) dr[j] = 0.0f;
            }
        if (e - i == 8) {
            const float *g[8], *q[8];
            for (int k = 0; k < 8; k++) { g[k] = dy + (i + k) * ldd; q[k] = x + (i + k) * ldx; }
            for (i64 j = 0; j < c; j++) {
                float mu = mean[j];
                a1[j] += (double)(((g[0][j] + g[1][j]) + (g[2][j] + g[3][j])) + ((g[4][j] + g[5][j]) + (g[6][j] + g[7][j])));
                a2[j] += (double)(((g[0][j] * (q[0][j] - mu) + g[1][j] * (q[1][j] - mu))
                                   + (g[2][j] * (q[2][j] - mu) + g[3][j] * (q[3][j] - mu)))
                                  + ((g[4][j] * (q[4][j] - mu) + g[5][j] * (q[5][j] - mu))
                                     + (g[6][j] * (q[6][j] - mu) + g[7][j] * (q[7][j] - mu))));
            }
        } else {
            for (i64 r = i; r < e; r++) {
                const float *g = dy + r * ldd, *q = x + r * ldx;
                for (i64 j = 0; j < c; j++) {
                    a1[j] += (double)g[j];
                    a2[j] += (double)(g[j] * (q[j] - mean[j]));
                }
            }
        }
        i = e;
    }
}

/* conv_loops.bn_train_bwd_finish_: dgamma, dbeta and dx's coefficients (aff (3, C) double) */
static void bn_bwd_finish(i64 m, i64 c, const float *gamma, const float *invstd, float *dgamma, float *dbeta,
                          const double *acc, double *aff) {
    double inv_m = 1.0 / (double)m;
    for (i64 j = 0; j < c; j++) {
        double istd = (double)invstd[j], sdy = acc[j], sdyx = acc[c + j];
        dbeta[j] = (float)sdy;
        dgamma[j] = (float)(sdyx * istd);
        double a = (double)gamma[j] * istd;
        aff[j] = a;
        aff[c + j] = -a * istd * istd * sdyx * inv_m;
        aff[2 * c + j] = -a * sdy * inv_m;
    }
}

/* conv_loops.bn_dx_: dx = aff[0] dy + aff[1] (x - mean) + aff[2] */
static void bn_dx(const float *dy, i64 ldd, const float *x, i64 ldx, const float *mean, float *dx, i64 ldo, i64 c,
                  const double *aff, i64 r0, i64 r1) {
    const double *a = aff, *b = aff + c, *k = aff + 2 * c;
    for (i64 i = r0; i < r1; i++) {
        const float *dr = dy + i * ldd, *xr = x + i * ldx;
        float *o = dx + i * ldo;
        for (i64 j = 0; j < c; j++) o[j] = (float)(a[j] * (double)dr[j] + b[j] * (double)(xr[j] - mean[j]) + k[j]);
    }
}

/* conv_par.bn_train_bwd_par_ (chunks = RNB_CHUNKS) or conv_loops.bn_train_bwd_ (chunks = 1) */
void rnb_bn_bwd(float *dy, i64 m, i64 c, i64 ldd, const float *x, i64 ldx, const float *y, i64 ldy,
                const float *gamma, const float *mean, const float *invstd, float *dx, i64 ldo, float *dgamma,
                float *dbeta, i64 act, double *acc, double *aff, double *parts, i64 chunks, int threads) {
    threads = team(threads);
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (i64 t = 0; t < chunks; t++)
        bn_grad_sums(dy, ldd, x, ldx, y, ldy, mean, c, act, parts + t * 2 * c, parts + (t * 2 + 1) * c,
                     cut8(m, chunks, t), cut8(m, chunks, t + 1));
    fold_parts(parts, chunks, c, acc);
    bn_bwd_finish(m, c, gamma, invstd, dgamma, dbeta, acc, aff);
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (i64 t = 0; t < chunks; t++)
        bn_dx(dy, ldd, x, ldx, mean, dx, ldo, c, aff, cut(m, chunks, t), cut(m, chunks, t + 1));
}

/* conv_loops.bn_fold_: the inference affine of a batch norm, in double, rounded once */
void rnb_bn_fold(const float *gamma, const float *beta, const float *rmean, const float *rvar, i64 c, double eps,
                 float *scale, float *bias) {
    for (i64 j = 0; j < c; j++) {
        double sc = (double)gamma[j] / sqrt((double)rvar[j] + eps);
        scale[j] = (float)sc;
        bias[j] = (float)((double)beta[j] - (double)rmean[j] * sc);
    }
}

/* conv_loops.bn_inf_ (channel_affine_) by row blocks */
void rnb_channel_affine(const float *x, i64 m, i64 c, i64 ldx, const float *a, const float *b, float *y, i64 ldy,
                        i64 act, int threads) {
    threads = team(threads);
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (i64 t = 0; t < RNB_CHUNKS; t++)
        channel_affine(x, ldx, y, ldy, c, a, b, act, cut(m, RNB_CHUNKS, t), cut(m, RNB_CHUNKS, t + 1));
}

/* ---- pooling (conv_loops.maxpool*_, avgpool_*, gap_*; conv_par.maxpool_*_par_) ---------------- */
#define IMAGE_BLOCKS(n) ((n) < RNB_CHUNKS ? (n) : RNB_CHUNKS)

static inline void window(i64 o, i64 s, i64 p, i64 k, i64 n, i64 *lo, i64 *hi) { /* conv_loops.window_ */
    i64 start = o * s - p;
    *lo = start > 0 ? start : 0;
    *hi = min64(start + k, n);
}

static void maxpool2_fwd_images(const float *x, float *y, int32_t *am, i64 n0, i64 n1, i64 h, i64 w, i64 c, i64 ho,
                                i64 wo) {
    for (i64 n = n0; n < n1; n++)
        for (i64 oh = 0; oh < ho; oh++) {
            const float *ra = x + ((n * h + 2 * oh) * w) * c, *rb = ra + w * c;
            float *yr = y + ((n * ho + oh) * wo) * c;
            int32_t *ar = am + ((n * ho + oh) * wo) * c;
            i64 i0 = 2 * oh * w;
            for (i64 ow = 0; ow < wo; ow++) {
                i64 base = 2 * ow * c, ob = ow * c, i00 = i0 + 2 * ow;
                for (i64 q = 0; q < c; q++) {
                    float b = ra[base + q], v;
                    i64 i = i00;
                    int take;
                    v = ra[base + c + q]; take = (v > b) | (v != v); b = take ? v : b; i = take ? i00 + 1 : i;
                    v = rb[base + q]; take = (v > b) | (v != v); b = take ? v : b; i = take ? i00 + w : i;
                    v = rb[base + c + q]; take = (v > b) | (v != v); b = take ? v : b; i = take ? i00 + w + 1 : i;
                    yr[ob + q] = b;
                    ar[ob + q] = (int32_t)i;
                }
            }
        }
}

static void maxpool_fwd_images(const float *x, float *y, int32_t *am, i64 n0, i64 n1, i64 h, i64 w, i64 c, i64 ho,
                               i64 wo, i64 k, i64 s, i64 p) {
    for (i64 n = n0; n < n1; n++)
        for (i64 oh = 0; oh < ho; oh++) {
            i64 hs, he, ws, we;
            window(oh, s, p, k, h, &hs, &he);
            for (i64 ow = 0; ow < wo; ow++) {
                window(ow, s, p, k, w, &ws, &we);
                float *yr = y + ((n * ho + oh) * wo + ow) * c;
                int32_t *ar = am + ((n * ho + oh) * wo + ow) * c;
                i64 first = hs * w + ws;
                for (i64 q = 0; q < c; q++) { yr[q] = -INFINITY; ar[q] = (int32_t)first; }
                for (i64 ih = hs; ih < he; ih++)
                    for (i64 iw = ws; iw < we; iw++) {
                        const float *xr = x + ((n * h + ih) * w + iw) * c;
                        int32_t idx = (int32_t)(ih * w + iw);
                        for (i64 q = 0; q < c; q++) {
                            float v = xr[q], b = yr[q];
                            int take = (v > b) | (v != v);
                            yr[q] = take ? v : b;
                            ar[q] = take ? idx : ar[q];
                        }
                    }
            }
        }
}

/* maxpool_fwd_par_: by blocks of min(n, RNB_CHUNKS) images; two_by_two picks maxpool2_fwd_ */
void rnb_maxpool_fwd(const float *x, i64 n, i64 h, i64 w, i64 c, float *y, int32_t *am, i64 ho, i64 wo, i64 k, i64 s,
                     i64 p, int two_by_two, int threads) {
    threads = team(threads);
    i64 parts = IMAGE_BLOCKS(n);
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (i64 t = 0; t < parts; t++) {
        i64 n0 = cut(n, parts, t), n1 = cut(n, parts, t + 1);
        if (two_by_two) maxpool2_fwd_images(x, y, am, n0, n1, h, w, c, ho, wo);
        else maxpool_fwd_images(x, y, am, n0, n1, h, w, c, ho, wo, k, s, p);
    }
}

static void maxpool2_bwd_images(const float *dy, const int32_t *am, float *dx, i64 n0, i64 n1, i64 h, i64 w, i64 c,
                                i64 ho, i64 wo) {
    for (i64 n = n0; n < n1; n++)
        for (i64 ih = 0; ih < h; ih++) {
            float *dr = dx + (n * h + ih) * w * c;
            i64 oh = ih / 2;
            if (oh >= ho) { for (i64 q = 0; q < w * c; q++) dr[q] = 0.0f; continue; }
            const float *gr = dy + (n * ho + oh) * wo * c;
            const int32_t *ar = am + (n * ho + oh) * wo * c;
            for (i64 iw = 0; iw < w; iw++) {
                i64 ow = iw / 2, base = iw * c;
                if (ow >= wo) { for (i64 q = 0; q < c; q++) dr[base + q] = 0.0f; continue; }
                i64 idx = ih * w + iw, ob = ow * c;
                for (i64 q = 0; q < c; q++) dr[base + q] = ar[ob + q] == idx ? (float)((double)gr[ob + q] + 0.0) : 0.0f;
            }
        }
}

static void maxpool_bwd_images(const float *dy, const int32_t *am, float *dx, i64 n0, i64 n1, i64 hw, i64 c, i64 howo) {
    for (i64 n = n0; n < n1; n++) {
        float *d = dx + n * hw * c;
        for (i64 q = 0; q < hw * c; q++) d[q] = 0.0f;
        for (i64 o = 0; o < howo; o++) {
            const float *gr = dy + (n * howo + o) * c;
            const int32_t *ar = am + (n * howo + o) * c;
            for (i64 q = 0; q < c; q++) d[(i64)ar[q] * c + q] += gr[q];
        }
    }
}

/* maxpool_bwd_par_: dx (N, H, W, C) from dy and the argmax, by blocks of images */
void rnb_maxpool_bwd(const float *dy, const int32_t *am, float *dx, i64 n, i64 h, i64 w, i64 c, i64 ho, i64 wo,
                     int two_by_two, int threads) {
    threads = team(threads);
    i64 parts = IMAGE_BLOCKS(n);
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (i64 t = 0; t < parts; t++) {
        i64 n0 = cut(n, parts, t), n1 = cut(n, parts, t + 1);
        if (two_by_two) maxpool2_bwd_images(dy, am, dx, n0, n1, h, w, c, ho, wo);
        else maxpool_bwd_images(dy, am, dx, n0, n1, h * w, c, ho * wo);
    }
}

/* conv_loops.avgpool_fwd_ / avgpool_bwd_ (padding counts; kk = k*k in float32), by blocks of images */
void rnb_avgpool(float *x, i64 n, i64 h, i64 w, i64 c, float *y, i64 ho, i64 wo, i64 k, i64 s, i64 p, float kk,
                 int backward, int threads) {
    threads = team(threads);
    i64 parts = IMAGE_BLOCKS(n);
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (i64 t = 0; t < parts; t++)
        for (i64 b = cut(n, parts, t); b < cut(n, parts, t + 1); b++) {
            if (backward)
                for (i64 q = 0; q < h * w * c; q++) x[b * h * w * c + q] = 0.0f;
            for (i64 oh = 0; oh < ho; oh++) {
                i64 hs, he, ws, we;
                window(oh, s, p, k, h, &hs, &he);
                for (i64 ow = 0; ow < wo; ow++) {
                    window(ow, s, p, k, w, &ws, &we);
                    float *yr = y + ((b * ho + oh) * wo + ow) * c;
                    if (!backward)
                        for (i64 q = 0; q < c; q++) yr[q] = 0.0f;
                    for (i64 ih = hs; ih < he; ih++)
                        for (i64 iw = ws; iw < we; iw++) {
                            float *xr = x + ((b * h + ih) * w + iw) * c;
                            if (backward) { for (i64 q = 0; q < c; q++) xr[q] += yr[q] / kk; }
                            else { for (i64 q = 0; q < c; q++) yr[q] += xr[q]; }
                        }
                    if (!backward)
                        for (i64 q = 0; q < c; q++) yr[q] = yr[q] / kk;
                }
            }
        }
}

/* conv_loops.gap_fwd_ (backward = 0: y (N, C) = the mean over the H*W pixels of x) or gap_bwd_ (x = dy / div
 * at every pixel), by blocks of images; div = H*W in float32 */
void rnb_gap(float *x, i64 n, i64 hw, i64 c, float *y, i64 ldy, float div, int backward, int threads) {
    threads = team(threads);
    i64 parts = IMAGE_BLOCKS(n);
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (i64 t = 0; t < parts; t++)
        for (i64 b = cut(n, parts, t); b < cut(n, parts, t + 1); b++) {
            float *yr = y + b * ldy, *xb = x + b * hw * c;
            if (backward) {
                for (i64 i = 0; i < hw; i++)
                    for (i64 q = 0; q < c; q++) xb[i * c + q] = yr[q] / div;
                continue;
            }
            for (i64 q = 0; q < c; q++) yr[q] = 0.0f;
            for (i64 i = 0; i < hw; i++)
                for (i64 q = 0; q < c; q++) yr[q] += xb[i * c + q];
            for (i64 q = 0; q < c; q++) yr[q] = yr[q] / div;
        }
}

/* ---- im2col / col2im (conv_loops.im2col_, col2im_, im2col_taps_; conv_par) -------------------- */
/* im2col_ of images n0..n1 of x3 (N, H, W*C) into cols rows from image n0's first (kk = k*k*c wide) */
void rnb_im2col_images(const float *x3, i64 h, i64 w, i64 c, float *cols, i64 k, i64 s, i64 p, i64 ho, i64 wo,
                       i64 n0, i64 n1) {
    i64 kc = k * c, kk = k * kc;
    float *row = cols;
    for (i64 n = n0; n < n1; n++)
        for (i64 oh = 0; oh < ho; oh++) {
            i64 h0 = oh * s - p;
            for (i64 ow = 0; ow < wo; ow++, row += kk) {
                i64 w0 = ow * s - p;
                i64 j0 = w0 < 0 ? -w0 : 0;
                i64 j1 = min64(k, w - w0);
                if (j1 < j0) j1 = j0;
                i64 len = (j1 - j0) * c;
                for (i64 i = 0; i < k; i++) {
                    i64 ih = h0 + i;
                    float *seg = row + i * kc;
                    if (ih < 0 || ih >= h) { for (i64 q = 0; q < kc; q++) seg[q] = 0.0f; continue; }
                    for (i64 q = 0; q < j0 * c; q++) seg[q] = 0.0f;
                    memcpy(seg + j0 * c, x3 + (n * h + ih) * w * c + (w0 + j0) * c, (size_t)len * sizeof(float));
                    for (i64 q = j1 * c; q < kc; q++) seg[q] = 0.0f;
                }
            }
        }
}

/* col2im_ of images n0..n1: dx3 = 0, then the rows of dcols (from image n0's first) added at their taps */
void rnb_col2im_images(const float *dcols, float *dx3, i64 h, i64 w, i64 c, i64 k, i64 s, i64 p, i64 ho, i64 wo,
                       i64 n0, i64 n1) {
    i64 kc = k * c, kk = k * kc;
    memset(dx3 + n0 * h * w * c, 0, (size_t)((n1 - n0) * h * w * c) * sizeof(float));
    const float *row = dcols;
    for (i64 n = n0; n < n1; n++)
        for (i64 oh = 0; oh < ho; oh++) {
            i64 h0 = oh * s - p;
            for (i64 ow = 0; ow < wo; ow++, row += kk) {
                i64 w0 = ow * s - p;
                i64 j0 = w0 < 0 ? -w0 : 0;
                i64 j1 = min64(k, w - w0);
                if (j1 <= j0) continue;
                i64 len = (j1 - j0) * c;
                for (i64 i = 0; i < k; i++) {
                    i64 ih = h0 + i;
                    if (ih < 0 || ih >= h) continue;
                    float *dst = dx3 + (n * h + ih) * w * c + (w0 + j0) * c;
                    const float *src = row + i * kc + j0 * c;
                    for (i64 q = 0; q < len; q++) dst[q] += src[q];
                }
            }
        }
}

/* conv_par.patches_par_: im2col (to_cols) or col2im of n images by blocks of min(n, RNB_CHUNKS) */
void rnb_patches(float *x3, i64 n, i64 h, i64 w, i64 c, float *cols, i64 k, i64 s, i64 p, i64 ho, i64 wo, int to_cols,
                 int threads) {
    threads = team(threads);
    i64 parts = IMAGE_BLOCKS(n), rows = ho * wo * k * k * c;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (i64 t = 0; t < parts; t++) {
        i64 n0 = cut(n, parts, t), n1 = cut(n, parts, t + 1);
        if (to_cols) rnb_im2col_images(x3, h, w, c, cols + n0 * rows, k, s, p, ho, wo, n0, n1);
        else rnb_col2im_images(cols + n0 * rows, x3, h, w, c, k, s, p, ho, wo, n0, n1);
    }
}

/* conv_par.im2col_taps_par_: one-channel columns tap-major, cols_t (k*k, M) with M = n*ho*wo; spans (k*k, 4) */
void rnb_im2col_taps(const float *x3, i64 n, i64 h, i64 w, float *cols_t, const i64 *spans, i64 k, i64 s, i64 p,
                     i64 ho, i64 wo, int threads) {
    threads = team(threads);
    i64 parts = IMAGE_BLOCKS(n), m = n * ho * wo;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (i64 t = 0; t < parts; t++)
        for (i64 b = cut(n, parts, t); b < cut(n, parts, t + 1); b++)
            for (i64 tap = 0; tap < k * k; tap++) {
                i64 i = tap / k, j = tap % k;
                const i64 *sp = spans + 4 * tap;
                i64 h_lo = sp[0], h_hi = sp[1], w_lo = sp[2], w_hi = sp[3];
                for (i64 oh = 0; oh < ho; oh++) {
                    float *dst = cols_t + tap * m + (b * ho + oh) * wo;
                    if (oh < h_lo || oh >= h_hi) { for (i64 q = 0; q < wo; q++) dst[q] = 0.0f; continue; }
                    for (i64 q = 0; q < w_lo; q++) dst[q] = 0.0f;
                    for (i64 q = w_hi; q < wo; q++) dst[q] = 0.0f;
                    const float *src = x3 + (b * h + oh * s - p + i) * w;
                    if (s == 1) memcpy(dst + w_lo, src + w_lo - p + j, (size_t)(w_hi - w_lo) * sizeof(float));
                    else
                        for (i64 q = 0; q < w_hi - w_lo; q++) dst[w_lo + q] = src[(w_lo + q) * s - p + j];
                }
            }
}

/* ---- ReLU (fused.relu_chunks_par_): forward (dy NULL) or backward from the input x ------------ */
void rnb_relu(const float *x, float *y, const float *dy, i64 n, int threads) {
    threads = team(threads);
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (i64 c = 0; c < RNB_CHUNKS; c++) {
        i64 lo, hi;
        chunk(n, c, &lo, &hi);
        if (dy) { for (i64 k = lo; k < hi; k++) y[k] = dy[k] * (x[k] > 0 ? 1.0f : 0.0f); }
        else { for (i64 k = lo; k < hi; k++) y[k] = x[k] > 0 ? x[k] : 0.0f; }
    }
}

/* ---- image batch gather (augment.gather_images_nhwc / transfer_images_step) ------------------- */
typedef struct { /* the bilinear tables of data/augment.bilinear_weights (resize only) */
    const i64 *yi0, *yi1, *xi0, *xi1;
    const float *yw0, *yw1, *xw0, *xw1;
} resize_tables;

static void gather_one(const float *src, float *out, i64 h, i64 w, i64 cn, i64 hs, i64 ws, i64 dy, i64 dx, int mirror,
                       float fill, const resize_tables *rt) {
    for (i64 y = 0; y < h; y++) {
        i64 sy = y + dy;
        float *orow = out + y * w * cn;
        if (sy < 0 || sy >= h) { for (i64 q = 0; q < w * cn; q++) orow[q] = fill; continue; }
        for (i64 x = 0; x < w; x++) {
            i64 sx = (mirror ? w - 1 - x : x) + dx;
            float *o = orow + x * cn;
            if (sx < 0 || sx >= w) { for (i64 c = 0; c < cn; c++) o[c] = fill; }
            else if (rt) {
                i64 ya = rt->yi0[sy], yb = rt->yi1[sy], xa = rt->xi0[sx], xb = rt->xi1[sx];
                float wya = rt->yw0[sy], wyb = rt->yw1[sy], wxa = rt->xw0[sx], wxb = rt->xw1[sx];
                for (i64 c = 0; c < cn; c++) {
                    const float *plane = src + c * hs * ws;
                    float top = wxa * plane[ya * ws + xa] + wxb * plane[ya * ws + xb];
                    float bot = wxa * plane[yb * ws + xa] + wxb * plane[yb * ws + xb];
                    o[c] = wya * top + wyb * bot;
                }
            } else {
                for (i64 c = 0; c < cn; c++) o[c] = src[(c * hs + sy) * ws + sx];
            }
        }
    }
}

/* Rows perm[cursor : cursor + b] of NCHW float32 xs (rows x cn x hs x ws) -> NHWC x_out (b, h, w, cn), labels
 * (int64 when wide, else int32) -> int32 y_out; sample j draws Philox block aug_offset[0] + j of the stream.
 * Returns 0 (and advances the cursor), 1 (cursor past the end) or 2 (a bad row), as the numba loop. */
i64 rnb_gather_images(const float *xs, i64 rows, i64 cn, i64 hs, i64 ws, const void *ys, int wide, const i64 *perm,
                      i64 nperm, i64 *cursor, const i64 *aug_offset, float *x_out, int32_t *y_out, i64 b, i64 h, i64 w,
                      uint64_t k0, uint64_t k1, uint64_t stream, i64 pad, i64 flip, double fill, const i64 *yi0,
                      const i64 *yi1, const float *yw0, const float *yw1, const i64 *xi0, const i64 *xi1,
                      const float *xw0, const float *xw1, int resize) {
    i64 start = cursor[0];
    if (start < 0 || start + b > nperm) return 1;
    resize_tables rt = {yi0, yi1, xi0, xi1, yw0, yw1, xw0, xw1};
    uint64_t m = (uint64_t)(2 * pad + 1), base = (uint64_t)aug_offset[0], wd[4];
    for (i64 i = 0; i < b; i++) {
        i64 j = start + i, r = perm[j];
        if (r < 0 || r >= rows) return 2;
        uint64_t blk = base + (uint64_t)j;
        philox_block(blk & 0xFFFFFFFFull, blk >> 32, stream, 0, k0, k1, wd);
        i64 dy = (i64)((wd[0] * m) >> 32) - pad, dx = (i64)((wd[1] * m) >> 32) - pad;
        int mirror = flip != 0 && (wd[2] >> 31) != 0;
        y_out[i] = wide ? (int32_t)((const i64 *)ys)[r] : ((const int32_t *)ys)[r];
        gather_one(xs + r * cn * hs * ws, x_out + i * h * w * cn, h, w, cn, hs, ws, dy, dx, mirror, (float)fill,
                   resize ? &rt : NULL);
    }
    cursor[0] = start + b;
    return 0;
}

/* ---- dropout (philox.dropout_kernel, then fused.mul_) ------------------------------------------ */
static inline float keep_mask(uint64_t w, float threshold, float scale) { /* philox._mask */
    return (float)(w >> 8) * 5.9604645e-08f < threshold ? scale : 0.0f;
}

/* mask = Philox words of blocks offset[0].. below threshold, times scale; offset[0] += the blocks used;
 * y = x * mask (n values) */
void rnb_dropout_fwd(const float *x, float *y, float *mask, i64 n, i64 *offset, uint64_t k0, uint64_t k1,
                     uint64_t stream, float threshold, float scale, int threads) {
    threads = team(threads);
    uint64_t base = (uint64_t)offset[0];
    i64 blocks = (n + 3) / 4;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (i64 t = 0; t < RNB_CHUNKS; t++) {
        uint64_t wd[4];
        for (i64 bk = cut(blocks, RNB_CHUNKS, t); bk < cut(blocks, RNB_CHUNKS, t + 1); bk++) {
            uint64_t blk = base + (uint64_t)bk;
            philox_block(blk & 0xFFFFFFFFull, blk >> 32, stream, 0, k0, k1, wd);
            for (i64 q = 0; q < 4 && 4 * bk + q < n; q++) {
                i64 e = 4 * bk + q;
                mask[e] = keep_mask(wd[q], threshold, scale);
                y[e] = x[e] * mask[e];
            }
        }
    }
    offset[0] = (i64)(base + (uint64_t)blocks);
}

/* fused.mul_: out = a * b over n flat values (dropout's backward), in RNB_CHUNKS blocks */
void rnb_mul(float *out, const float *a, const float *b, i64 n, int threads) {
    threads = team(threads);
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (i64 c = 0; c < RNB_CHUNKS; c++) {
        i64 lo, hi;
        chunk(n, c, &lo, &hi);
        for (i64 k = lo; k < hi; k++) out[k] = a[k] * b[k];
    }
}
