/* The conv net's memory passes in C: batch norm, pooling, global average pooling, im2col / col2im,
 * ReLU, the image batch gather and the dropout mask; the twins of conv_loops.py, conv_par.py,
 * fused.relu_chunks_, augment.gather_images_nhwc and philox.dropout_kernel (kernels/conv_native.py
 * binds them; tests/test_conv_native.py compares their bytes).
 *
 * As native.c: the same types at every step as numba's (float32 where numba keeps float32, double
 * where a float64 operand or literal widens), the same order of additions, the same cuts of a range;
 * built with -ffp-contract=off. Threads: rnb_parallel (pool_native.c) over fixed blocks (images, or
 * RNB_CHUNKS row blocks), each block's values independent of the thread that computes it. Feature maps
 * are NHWC float32, 2-D views (rows, C) take a row stride in elements. Nothing here allocates.
 */
#include "native.h"

/* ---- batch norm (conv_loops.bn_*_, conv_par.bn_train_*_par_) ------------------------------------ */
static inline i64 cut8(i64 m, i64 chunks, i64 t) { /* conv_par._cut8 */
    return min64(m, (cut(m, chunks, t) + 7) / 8 * 8);
}

/* conv_loops.bn_shifted_sums_: eight-row blocks summed pairwise in float32, block sums in double */
static void bn_shifted_sums(const float *restrict x, i64 ldx, i64 c, const float *restrict x0, double *restrict a1,
                            double *restrict a2, i64 r0, i64 r1) {
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
static void channel_affine(const float *restrict x, i64 ldx, float *restrict y, i64 ldy, i64 c, const float *restrict a,
                           const float *restrict b, i64 act, i64 r0, i64 r1) {
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
typedef struct { /* a pass over row blocks of (rows, C) views: batch norm and the channel affine */
    const float *x, *y, *mean, *a, *b;
    float *out, *dy;
    i64 m, c, ldx, ldy, ldo, ldd, act, chunks;
    double *parts;
    const double *daff;
    const float *pdy, *ppy; /* bn_bwd with dy_pool: dy made from a max pool's gradient, argmax and output */
    const int32_t *pam;
    i64 h, w, k;
} rows_pass;

/* rows i..e of dy where it comes from a k x k, stride-k max pool's gradient pdy, argmax pam and output ppy
 * (N, H / k, W / k, C), made into buf (rows ld apart): the gradient where the window's argmax is this pixel and its
 * max is above 0, else 0.0, as maxpool_bwd (relu) writes it (ops/pool.py grad_from_pool). The pixel is found
 * once and then stepped: a division per row cost more than the row (C = 32 at 28x28: 4 ms a pass) */
static void pooled_dy_rows(const rows_pass *r, i64 i, i64 e, float *restrict buf, i64 ld) {
    i64 c = r->c, w = r->w, h = r->h, k = r->k, ho = h / k, wo = w / k;
    i64 iw = i % w, ih = (i / w) % h, n = i / (w * h);
    for (i64 q = i; q < e; q++) {
        float *restrict out = buf + (q - i) * ld;
        i64 oh = k == 2 ? ih >> 1 : ih / k, ow = k == 2 ? iw >> 1 : iw / k;
        if (oh < ho && ow < wo) {
            i64 o = ((n * ho + oh) * wo + ow) * c;
            int32_t me = (int32_t)(ih * w + iw);
            const float *restrict g = r->pdy + o, *restrict py = r->ppy + o;
            const int32_t *restrict am = r->pam + o;
            for (i64 j = 0; j < c; j++) /* g + 0.0f: -0.0 as +0.0, as maxpool_bwd's (double)g + 0.0 rounded back */
                out[j] = (am[j] == me) & (py[j] > 0) ? g[j] + 0.0f : 0.0f;
        } else {
            for (i64 j = 0; j < c; j++) out[j] = 0.0f;
        }
        if (++iw == w) {
            iw = 0;
            if (++ih == h) { ih = 0; n++; }
        }
    }
}

/* rows i..e of dy: where it comes from a pool, made first into the same rows of dx (r->out), which the dx pass
 * then reads as dy and overwrites (value by value, as in place) */
static const float *dy_rows(const rows_pass *r, i64 i, i64 e, i64 *ld) {
    if (!r->pdy) {
        *ld = r->ldd;
        return r->dy + i * r->ldd;
    }
    pooled_dy_rows(r, i, e, r->out + i * r->ldo, r->ldo);
    *ld = r->ldo;
    return r->out + i * r->ldo;
}

static void bn_sums_block(void *p, i64 t) {
    const rows_pass *r = p;
    bn_shifted_sums(r->x, r->ldx, r->c, r->x, r->parts + t * 2 * r->c, r->parts + (t * 2 + 1) * r->c,
                    cut8(r->m, r->chunks, t), cut8(r->m, r->chunks, t + 1));
}

static void affine_block(void *p, i64 t) {
    const rows_pass *r = p;
    channel_affine(r->x, r->ldx, r->out, r->ldo, r->c, r->a, r->b, r->act, cut(r->m, r->chunks, t),
                   cut(r->m, r->chunks, t + 1));
}

void rnb_bn_fwd(const float *x, i64 m, i64 c, i64 ldx, const float *gamma, const float *beta, float *y, i64 ldy,
                float *mean, float *invstd, float *rmean, float *rvar, double momentum, double eps, i64 act,
                double *acc, float *aff, double *parts, i64 chunks, int threads) {
    rows_pass r = {.x = x, .a = aff, .b = aff + c, .out = y, .m = m, .c = c, .ldx = ldx, .ldo = ldy, .act = act,
                   .chunks = chunks, .parts = parts};
    rnb_parallel(threads, chunks, bn_sums_block, &r);
    fold_parts(parts, chunks, c, acc);
    bn_fwd_finish(x, m, c, gamma, beta, mean, invstd, rmean, rvar, momentum, eps, acc, aff);
    if (y) rnb_parallel(threads, chunks, affine_block, &r); /* NULL: the max pool after it applies aff */
}

/* conv_loops.bn_grad_sums_: dy *= (y > 0) with a fused relu, in place; s1 = sum dy, s2 = sum dy (x - mean); with a
 * pool's dy (r->pdy) each block of eight rows is made first, into dx's rows (dy_rows) */
static void bn_grad_sums(const rows_pass *r, double *restrict a1, double *restrict a2, i64 r0, i64 r1) {
    const float *restrict x = r->x, *restrict y = r->y, *restrict mean = r->mean;
    i64 c = r->c, ldx = r->ldx, ldy = r->ldy, act = r->act, ldd;
    for (i64 j = 0; j < c; j++) { a1[j] = 0.0; a2[j] = 0.0; }
    for (i64 i = r0; i < r1;) {
        i64 e = min64(r1, i + 8);
        if (act == 1)
            for (i64 q = i; q < e; q++) {
                float *restrict dr = r->dy + q * r->ldd;
                const float *restrict yr = y + q * ldy;
                for (i64 j = 0; j < c; j++) dr[j] = yr[j] > 0 ? dr[j] : 0.0f; /* a select: it vectorises */
            }
        const float *dy = dy_rows(r, i, e, &ldd);
        if (e - i == 8) {
            const float *restrict g[8], *restrict q[8];
            for (int k = 0; k < 8; k++) { g[k] = dy + k * ldd; q[k] = x + (i + k) * ldx; }
            for (i64 j = 0; j < c; j++) {
                float mu = mean[j];
                a1[j] += (double)(((g[0][j] + g[1][j]) + (g[2][j] + g[3][j])) + ((g[4][j] + g[5][j]) + (g[6][j] + g[7][j])));
                a2[j] += (double)(((g[0][j] * (q[0][j] - mu) + g[1][j] * (q[1][j] - mu))
                                   + (g[2][j] * (q[2][j] - mu) + g[3][j] * (q[3][j] - mu)))
                                  + ((g[4][j] * (q[4][j] - mu) + g[5][j] * (q[5][j] - mu))
                                     + (g[6][j] * (q[6][j] - mu) + g[7][j] * (q[7][j] - mu))));
            }
        } else {
            for (i64 q = i; q < e; q++) {
                const float *g = dy + (q - i) * ldd, *xr = x + q * ldx;
                for (i64 j = 0; j < c; j++) {
                    a1[j] += (double)g[j];
                    a2[j] += (double)(g[j] * (xr[j] - mean[j]));
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

/* conv_loops.bn_dx_: dx = aff[0] dy + aff[1] (x - mean) + aff[2]; dy may be dx itself (each value read, then
 * written: no restrict on them) */
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
static void grad_sums_block(void *p, i64 t) {
    const rows_pass *r = p;
    bn_grad_sums(r, r->parts + t * 2 * r->c, r->parts + (t * 2 + 1) * r->c, cut8(r->m, r->chunks, t),
                 cut8(r->m, r->chunks, t + 1));
}

static void dx_block(void *p, i64 t) {
    const rows_pass *r = p;
    bn_dx(r->dy, r->ldd, r->x, r->ldx, r->mean, r->out, r->ldo, r->c, r->daff, cut(r->m, r->chunks, t),
          cut(r->m, r->chunks, t + 1));
}

void rnb_bn_bwd(float *dy, i64 m, i64 c, i64 ldd, const float *x, i64 ldx, const float *y, i64 ldy,
                const float *gamma, const float *mean, const float *invstd, float *dx, i64 ldo, float *dgamma,
                float *dbeta, i64 act, double *acc, double *aff, double *parts, i64 chunks, int threads,
                const float *pdy, const int32_t *pam, const float *ppy, i64 h, i64 w, i64 k) {
    rows_pass r = {.x = x, .y = y, .mean = mean, .out = dx, .dy = dy, .m = m, .c = c, .ldx = ldx, .ldy = ldy,
                   .ldo = ldo, .ldd = ldd, .act = act, .chunks = chunks, .parts = parts, .daff = aff,
                   .pdy = pdy, .pam = pam, .ppy = ppy, .h = h, .w = w, .k = k};
    rnb_parallel(threads, chunks, grad_sums_block, &r);
    fold_parts(parts, chunks, c, acc);
    bn_bwd_finish(m, c, gamma, invstd, dgamma, dbeta, acc, aff);
    if (pdy) { /* the sums pass made dy in dx's rows: the dx pass reads it there */
        r.dy = dx;
        r.ldd = ldo;
    }
    rnb_parallel(threads, chunks, dx_block, &r);
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
    rows_pass r = {.x = x, .a = a, .b = b, .out = y, .m = m, .c = c, .ldx = ldx, .ldo = ldy, .act = act,
                   .chunks = RNB_CHUNKS};
    rnb_parallel(threads, RNB_CHUNKS, affine_block, &r);
}

/* ---- pooling (conv_loops.maxpool*_, avgpool_*, gap_*; conv_par.maxpool_*_par_) ---------------- */
#define IMAGE_BLOCKS(n) ((n) < RNB_CHUNKS ? (n) : RNB_CHUNKS)

typedef struct { /* a pass over blocks of images: pooling, gap, im2col / col2im */
    float *x, *y, *cols;
    const float *cx, *aa;
    int32_t *am;
    const i64 *spans;
    i64 n, h, w, c, ho, wo, k, s, p, parts, ldy, flag;
    float kk;
} image_pass;

#define IMAGES(ip, t, n0, n1) i64 n0 = cut((ip)->n, (ip)->parts, t), n1 = cut((ip)->n, (ip)->parts, t + 1)

static inline void window(i64 o, i64 s, i64 p, i64 k, i64 n, i64 *lo, i64 *hi) { /* conv_loops.window_ */
    i64 start = o * s - p;
    *lo = start > 0 ? start : 0;
    *hi = min64(start + k, n);
}

/* a batch norm's y from its input (channel_affine with relu): the max pools of bn_relu=True read x and aff */
static inline float bn_relu(float x, float a, float b) {
    float z = x * a + b;
    return z > 0 ? z : 0.0f;
}

/* the next value of a 2x2 window: the first max (NaN wins) and its index */
#define TAKE(v, at) do { int take_ = (v > b) | (v != v); b = take_ ? v : b; i = take_ ? (at) : i; } while (0)
/* TAKE where no value is NaN (bn_relu's never are): GCC 12 does not vectorise the NaN test after bn_relu's select */
#define TAKE_NUM(v, at) do { int take_ = v > b; b = take_ ? v : b; i = take_ ? (at) : i; } while (0)

/* one output row of 2x2 windows from input rows ra and rb; A, B NULL, or a batch norm's scale and shift, the
 * values then bn_relu(x, A, B) (its output, which it did not write) */
static void maxpool2_row(const float *restrict ra, const float *restrict rb, const float *restrict A,
                         const float *restrict B, float *restrict yr, int32_t *restrict ar, i64 wo, i64 c, i64 i0,
                         i64 w) {
    for (i64 ow = 0; ow < wo; ow++) {
        i64 base = 2 * ow * c, ob = ow * c, i00 = i0 + 2 * ow;
        const float *p0 = ra + base, *p1 = ra + base + c, *p2 = rb + base, *p3 = rb + base + c;
        if (A)
            for (i64 q = 0; q < c; q++) {
                float a = A[q], s = B[q], b = bn_relu(p0[q], a, s), v;
                i64 i = i00;
                v = bn_relu(p1[q], a, s); TAKE_NUM(v, i00 + 1);
                v = bn_relu(p2[q], a, s); TAKE_NUM(v, i00 + w);
                v = bn_relu(p3[q], a, s); TAKE_NUM(v, i00 + w + 1);
                yr[ob + q] = b;
                ar[ob + q] = (int32_t)i;
            }
        else
            for (i64 q = 0; q < c; q++) {
                float b = p0[q], v;
                i64 i = i00;
                v = p1[q]; TAKE(v, i00 + 1);
                v = p2[q]; TAKE(v, i00 + w);
                v = p3[q]; TAKE(v, i00 + w + 1);
                yr[ob + q] = b;
                ar[ob + q] = (int32_t)i;
            }
    }
}

/* aa NULL, or (2, C) scale and shift: the window's values are bn_relu(x, aa[0], aa[1]) */
static void maxpool2_fwd_images(const float *restrict x, const float *restrict aa, float *restrict y,
                                int32_t *restrict am, i64 n0, i64 n1, i64 h, i64 w, i64 c, i64 ho, i64 wo) {
    for (i64 n = n0; n < n1; n++)
        for (i64 oh = 0; oh < ho; oh++) {
            const float *ra = x + ((n * h + 2 * oh) * w) * c;
            maxpool2_row(ra, ra + w * c, aa, aa ? aa + c : NULL, y + ((n * ho + oh) * wo) * c,
                         am + ((n * ho + oh) * wo) * c, wo, c, 2 * oh * w, w);
        }
}

static void maxpool_fwd_images(const float *restrict x, const float *restrict aa, float *restrict y,
                               int32_t *restrict am, i64 n0, i64 n1, i64 h, i64 w, i64 c, i64 ho, i64 wo, i64 k, i64 s,
                               i64 p) {
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
                        if (aa) /* no NaN among bn_relu's values: v > b decides (TAKE_NUM) */
                            for (i64 q = 0; q < c; q++) {
                                float v = bn_relu(xr[q], aa[q], aa[c + q]), b = yr[q];
                                int take = v > b;
                                yr[q] = take ? v : b;
                                ar[q] = take ? idx : ar[q];
                            }
                        else
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

static void maxpool_fwd_block(void *v, i64 t) {
    const image_pass *a = v;
    IMAGES(a, t, n0, n1);
    if (a->flag) maxpool2_fwd_images(a->cx, a->aa, a->y, a->am, n0, n1, a->h, a->w, a->c, a->ho, a->wo);
    else maxpool_fwd_images(a->cx, a->aa, a->y, a->am, n0, n1, a->h, a->w, a->c, a->ho, a->wo, a->k, a->s, a->p);
}

/* maxpool_fwd_par_: by blocks of min(n, RNB_CHUNKS) images; two_by_two picks maxpool2_fwd_; aa NULL, or a batch
 * norm's (2, C) affine for the pool of its relu output made from its input x (bn_relu in maxpool_fwd_par_) */
void rnb_maxpool_fwd(const float *x, const float *aa, i64 n, i64 h, i64 w, i64 c, float *y, int32_t *am, i64 ho,
                     i64 wo, i64 k, i64 s, i64 p, int two_by_two, int threads) {
    image_pass ip = {.cx = x, .aa = aa, .y = y, .am = am, .n = n, .h = h, .w = w, .c = c, .ho = ho, .wo = wo, .k = k,
                     .s = s, .p = p, .parts = IMAGE_BLOCKS(n), .flag = two_by_two};
    rnb_parallel(threads, ip.parts, maxpool_fwd_block, &ip);
}

/* py (the forward's output) not NULL: the gradient of a fused ReLU before the pool too, 0.0 where the window's
 * max is not above 0 (ops/pool.py relu_through_pool) */
static void maxpool2_bwd_images(const float *restrict dy, const int32_t *restrict am, const float *restrict py,
                                float *restrict dx, i64 n0, i64 n1, i64 h, i64 w, i64 c, i64 ho, i64 wo) {
    for (i64 n = n0; n < n1; n++)
        for (i64 ih = 0; ih < h; ih++) {
            float *dr = dx + (n * h + ih) * w * c;
            i64 oh = ih / 2;
            if (oh >= ho) { for (i64 q = 0; q < w * c; q++) dr[q] = 0.0f; continue; }
            const float *gr = dy + (n * ho + oh) * wo * c;
            const int32_t *ar = am + (n * ho + oh) * wo * c;
            const float *pr = py ? py + (n * ho + oh) * wo * c : NULL;
            for (i64 iw = 0; iw < w; iw++) {
                i64 ow = iw / 2, base = iw * c;
                if (ow >= wo) { for (i64 q = 0; q < c; q++) dr[base + q] = 0.0f; continue; }
                i64 idx = ih * w + iw, ob = ow * c;
                if (pr)
                    for (i64 q = 0; q < c; q++)
                        dr[base + q] = ar[ob + q] == idx && pr[ob + q] > 0 ? (float)((double)gr[ob + q] + 0.0) : 0.0f;
                else
                    for (i64 q = 0; q < c; q++) dr[base + q] = ar[ob + q] == idx ? (float)((double)gr[ob + q] + 0.0) : 0.0f;
            }
        }
}

static void maxpool_bwd_images(const float *dy, const int32_t *am, const float *py, float *dx, i64 n0, i64 n1, i64 hw,
                               i64 c, i64 howo) {
    for (i64 n = n0; n < n1; n++) {
        float *d = dx + n * hw * c;
        for (i64 q = 0; q < hw * c; q++) d[q] = 0.0f;
        for (i64 o = 0; o < howo; o++) {
            const float *gr = dy + (n * howo + o) * c, *pr = py ? py + (n * howo + o) * c : NULL;
            const int32_t *ar = am + (n * howo + o) * c;
            for (i64 q = 0; q < c; q++) d[(i64)ar[q] * c + q] += !pr || pr[q] > 0 ? gr[q] : 0.0f;
        }
    }
}

static void maxpool_bwd_block(void *v, i64 t) {
    const image_pass *a = v;
    IMAGES(a, t, n0, n1);
    if (a->flag) maxpool2_bwd_images(a->cx, a->am, a->y, a->x, n0, n1, a->h, a->w, a->c, a->ho, a->wo);
    else maxpool_bwd_images(a->cx, a->am, a->y, a->x, n0, n1, a->h * a->w, a->c, a->ho * a->wo);
}

/* maxpool_bwd_par_: dx (N, H, W, C) from dy and the argmax, by blocks of images; py NULL, or the forward's
 * output for the ReLU's gradient too (relu in maxpool_bwd_par_) */
void rnb_maxpool_bwd(const float *dy, const int32_t *am, const float *py, float *dx, i64 n, i64 h, i64 w, i64 c,
                     i64 ho, i64 wo, int two_by_two, int threads) {
    image_pass ip = {.cx = dy, .am = (int32_t *)am, .y = (float *)py, .x = dx, .n = n, .h = h, .w = w, .c = c,
                     .ho = ho, .wo = wo, .parts = IMAGE_BLOCKS(n), .flag = two_by_two};
    rnb_parallel(threads, ip.parts, maxpool_bwd_block, &ip);
}

static void avgpool_block(void *v, i64 t) {
    const image_pass *a = v;
    i64 h = a->h, w = a->w, c = a->c, ho = a->ho, wo = a->wo;
    float *x = a->x, *y = a->y, kk = a->kk;
    IMAGES(a, t, n0, n1);
    for (i64 b = n0; b < n1; b++) {
        if (a->flag)
            for (i64 q = 0; q < h * w * c; q++) x[b * h * w * c + q] = 0.0f;
        for (i64 oh = 0; oh < ho; oh++) {
            i64 hs, he, ws, we;
            window(oh, a->s, a->p, a->k, h, &hs, &he);
            for (i64 ow = 0; ow < wo; ow++) {
                window(ow, a->s, a->p, a->k, w, &ws, &we);
                float *yr = y + ((b * ho + oh) * wo + ow) * c;
                if (!a->flag)
                    for (i64 q = 0; q < c; q++) yr[q] = 0.0f;
                for (i64 ih = hs; ih < he; ih++)
                    for (i64 iw = ws; iw < we; iw++) {
                        float *xr = x + ((b * h + ih) * w + iw) * c;
                        if (a->flag) { for (i64 q = 0; q < c; q++) xr[q] += yr[q] / kk; }
                        else { for (i64 q = 0; q < c; q++) yr[q] += xr[q]; }
                    }
                if (!a->flag)
                    for (i64 q = 0; q < c; q++) yr[q] = yr[q] / kk;
            }
        }
    }
}

/* conv_loops.avgpool_fwd_ / avgpool_bwd_ (padding counts; kk = k*k in float32), by blocks of images */
void rnb_avgpool(float *x, i64 n, i64 h, i64 w, i64 c, float *y, i64 ho, i64 wo, i64 k, i64 s, i64 p, float kk,
                 int backward, int threads) {
    image_pass ip = {.x = x, .y = y, .n = n, .h = h, .w = w, .c = c, .ho = ho, .wo = wo, .k = k, .s = s, .p = p,
                     .parts = IMAGE_BLOCKS(n), .flag = backward, .kk = kk};
    rnb_parallel(threads, ip.parts, avgpool_block, &ip);
}

static void gap_block(void *v, i64 t) {
    const image_pass *a = v;
    i64 hw = a->h, c = a->c;
    float div = a->kk;
    IMAGES(a, t, n0, n1);
    for (i64 b = n0; b < n1; b++) {
        float *yr = a->y + b * a->ldy, *xb = a->x + b * hw * c;
        if (a->flag) {
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

/* conv_loops.gap_fwd_ (backward = 0: y (N, C) = the mean over the H*W pixels of x) or gap_bwd_ (x = dy / div
 * at every pixel), by blocks of images; div = H*W in float32 */
void rnb_gap(float *x, i64 n, i64 hw, i64 c, float *y, i64 ldy, float div, int backward, int threads) {
    image_pass ip = {.x = x, .y = y, .n = n, .h = hw, .c = c, .ldy = ldy, .parts = IMAGE_BLOCKS(n), .flag = backward,
                     .kk = div};
    rnb_parallel(threads, ip.parts, gap_block, &ip);
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

static void patches_block(void *v, i64 t) {
    const image_pass *a = v;
    i64 rows = a->ho * a->wo * a->k * a->k * a->c;
    IMAGES(a, t, n0, n1);
    if (a->flag) rnb_im2col_images(a->x, a->h, a->w, a->c, a->cols + n0 * rows, a->k, a->s, a->p, a->ho, a->wo, n0, n1);
    else rnb_col2im_images(a->cols + n0 * rows, a->x, a->h, a->w, a->c, a->k, a->s, a->p, a->ho, a->wo, n0, n1);
}

/* conv_par.patches_par_: im2col (to_cols) or col2im of n images by blocks of min(n, RNB_CHUNKS) */
void rnb_patches(float *x3, i64 n, i64 h, i64 w, i64 c, float *cols, i64 k, i64 s, i64 p, i64 ho, i64 wo, int to_cols,
                 int threads) {
    image_pass ip = {.x = x3, .cols = cols, .n = n, .h = h, .w = w, .c = c, .ho = ho, .wo = wo, .k = k, .s = s, .p = p,
                     .parts = IMAGE_BLOCKS(n), .flag = to_cols};
    rnb_parallel(threads, ip.parts, patches_block, &ip);
}

static void taps_block(void *v, i64 t) {
    const image_pass *a = v;
    i64 k = a->k, ho = a->ho, wo = a->wo, m = a->n * ho * wo;
    IMAGES(a, t, n0, n1);
    for (i64 b = n0; b < n1; b++)
        for (i64 tap = 0; tap < k * k; tap++) {
            i64 i = tap / k, j = tap % k;
            const i64 *sp = a->spans + 4 * tap;
            i64 h_lo = sp[0], h_hi = sp[1], w_lo = sp[2], w_hi = sp[3];
            for (i64 oh = 0; oh < ho; oh++) {
                float *dst = a->cols + tap * m + (b * ho + oh) * wo;
                if (oh < h_lo || oh >= h_hi) { for (i64 q = 0; q < wo; q++) dst[q] = 0.0f; continue; }
                for (i64 q = 0; q < w_lo; q++) dst[q] = 0.0f;
                for (i64 q = w_hi; q < wo; q++) dst[q] = 0.0f;
                const float *src = a->cx + (b * a->h + oh * a->s - a->p + i) * a->w;
                if (a->s == 1) memcpy(dst + w_lo, src + w_lo - a->p + j, (size_t)(w_hi - w_lo) * sizeof(float));
                else
                    for (i64 q = 0; q < w_hi - w_lo; q++) dst[w_lo + q] = src[(w_lo + q) * a->s - a->p + j];
            }
        }
}

/* conv_par.im2col_taps_par_: one-channel columns tap-major, cols_t (k*k, M) with M = n*ho*wo; spans (k*k, 4) */
void rnb_im2col_taps(const float *x3, i64 n, i64 h, i64 w, float *cols_t, const i64 *spans, i64 k, i64 s, i64 p,
                     i64 ho, i64 wo, int threads) {
    image_pass ip = {.cx = x3, .cols = cols_t, .spans = spans, .n = n, .h = h, .w = w, .ho = ho, .wo = wo, .k = k,
                     .s = s, .p = p, .parts = IMAGE_BLOCKS(n)};
    rnb_parallel(threads, ip.parts, taps_block, &ip);
}

/* ---- element-wise passes over RNB_CHUNKS blocks: ReLU (fused.relu_chunks_par_), mul (fused.mul_), add -- */
typedef struct {
    const float *x, *dy, *b;
    float *y;
    i64 n;
    int op; /* binary_block's operation */
} flat_pass;

static void relu_block(void *v, i64 c) {
    const flat_pass *a = v;
    i64 lo, hi;
    chunk(a->n, c, &lo, &hi);
    const float *x = a->x, *dy = a->dy;
    float *y = a->y;
    if (dy) { for (i64 k = lo; k < hi; k++) y[k] = dy[k] * (x[k] > 0 ? 1.0f : 0.0f); }
    else { for (i64 k = lo; k < hi; k++) y[k] = x[k] > 0 ? x[k] : 0.0f; }
}

/* ReLU forward (dy NULL) or backward from the input x */
void rnb_relu(const float *x, float *y, const float *dy, i64 n, int threads) {
    flat_pass f = {.x = x, .dy = dy, .y = y, .n = n};
    rnb_parallel(threads, RNB_CHUNKS, relu_block, &f);
}

static void binary_block(void *v, i64 c) { /* y = x * b (op '*'), x + b (op '+'), relu(x + b) (op 'r'), or x
                                             * where b is NULL */
    const flat_pass *a = v;
    i64 lo, hi;
    chunk(a->n, c, &lo, &hi);
    if (a->b == NULL) memmove(a->y + lo, a->x + lo, (size_t)(hi - lo) * sizeof(float));
    else if (a->op == '*') for (i64 k = lo; k < hi; k++) a->y[k] = a->x[k] * a->b[k];
    else if (a->op == 'r') {
        for (i64 k = lo; k < hi; k++) {
            float s = a->x[k] + a->b[k];
            a->y[k] = s > 0 ? s : 0.0f; /* relu_block's forward on the sum: the bytes of the add and the ReLU apart */
        }
    } else for (i64 k = lo; k < hi; k++) a->y[k] = a->x[k] + a->b[k];
}

/* out = a * b over n flat values (dropout's backward) */
void rnb_mul(float *out, const float *a, const float *b, i64 n, int threads) {
    flat_pass f = {.x = a, .b = b, .y = out, .n = n, .op = '*'};
    rnb_parallel(threads, RNB_CHUNKS, binary_block, &f);
}

/* out = a + b over n flat values (a residual sum, a gradient accumulated in place: out may be a or b), with relu
 * relu(a + b) (a residual sum with its ReLU fused, ops/add.py), or out = a where b is NULL (the gradient add hands
 * to a branch); by blocks on the pool */
void rnb_add(float *out, const float *a, const float *b, i64 n, int relu, int threads) {
    flat_pass f = {.x = a, .b = b, .y = out, .n = n, .op = relu ? 'r' : '+'};
    rnb_parallel(threads, RNB_CHUNKS, binary_block, &f);
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
        if (cn == 1 && !mirror && !rt) { /* one channel, no flip: the row is one shifted copy (a grayscale batch) */
            const float *srow = src + sy * ws;
            for (i64 x = 0; x < w; x++) { i64 sx = x + dx; orow[x] = sx >= 0 && sx < w ? srow[sx] : fill; }
            continue;
        }
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
 * Returns 0 (and, with advance, moves the cursor on by b), 1 (cursor past the end) or 2 (a bad row), as the numba
 * loops: transfer_images_step (advance 1) and, for a batch claimed into (start, aug_base), transfer_images_claimed
 * (cursor and aug_offset point into the claim, advance 0). */
i64 rnb_gather_images(const float *xs, i64 rows, i64 cn, i64 hs, i64 ws, const void *ys, int wide, const i64 *perm,
                      i64 nperm, i64 *cursor, const i64 *aug_offset, float *x_out, int32_t *y_out, i64 b, i64 h, i64 w,
                      uint64_t k0, uint64_t k1, uint64_t stream, i64 pad, i64 flip, double fill, const i64 *yi0,
                      const i64 *yi1, const float *yw0, const float *yw1, const i64 *xi0, const i64 *xi1,
                      const float *xw0, const float *xw1, int resize, int advance) {
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
    if (advance) cursor[0] = start + b;
    return 0;
}

/* augment.claim_batch: state = (cursor, aug_offset), then the cursor moves on by n */
void rnb_claim_batch(i64 *cursor, const i64 *aug_offset, i64 n, i64 *state) {
    state[0] = cursor[0];
    state[1] = aug_offset[0];
    cursor[0] = cursor[0] + n;
}

/* ---- dropout (philox.dropout_kernel, then fused.mul_) ------------------------------------------ */
static inline float keep_mask(uint64_t w, float threshold, float scale) { /* philox._mask */
    return (float)(w >> 8) * 5.9604645e-08f < threshold ? scale : 0.0f;
}

typedef struct {
    const float *x;
    float *y, *mask;
    i64 n, blocks;
    uint64_t base, k0, k1, stream;
    float threshold, scale;
} dropout_pass;

static void dropout_block(void *v, i64 t) {
    const dropout_pass *a = v;
    uint64_t wd[4];
    for (i64 bk = cut(a->blocks, RNB_CHUNKS, t); bk < cut(a->blocks, RNB_CHUNKS, t + 1); bk++) {
        uint64_t blk = a->base + (uint64_t)bk;
        philox_block(blk & 0xFFFFFFFFull, blk >> 32, a->stream, 0, a->k0, a->k1, wd);
        for (i64 q = 0; q < 4 && 4 * bk + q < a->n; q++) {
            i64 e = 4 * bk + q;
            a->mask[e] = keep_mask(wd[q], a->threshold, a->scale);
            a->y[e] = a->x[e] * a->mask[e];
        }
    }
}

/* mask = Philox words of blocks offset[0].. below threshold, times scale; offset[0] += the blocks used;
 * y = x * mask (n values) */
void rnb_dropout_fwd(const float *x, float *y, float *mask, i64 n, i64 *offset, uint64_t k0, uint64_t k1,
                     uint64_t stream, float threshold, float scale, int threads) {
    dropout_pass d = {.x = x, .y = y, .mask = mask, .n = n, .blocks = (n + 3) / 4, .base = (uint64_t)offset[0],
                      .k0 = k0, .k1 = k1, .stream = stream, .threshold = threshold, .scale = scale};
    rnb_parallel(threads, RNB_CHUNKS, dropout_block, &d);
    offset[0] = (i64)(d.base + (uint64_t)d.blocks);
}
