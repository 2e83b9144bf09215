/* Causal self-attention's CPU kernels in C: the twins of ops/attention_kernels.py's materialised form
 * (attn_scores, attn_mix, attn_mix_bwd, attn_scores_bwd) and its flash form (flash_attn_fwd, _bwd), bound
 * by kernels/attention_native.py; tests/test_attention_native.py compares their bytes.
 *
 * Why: a GPT plan's step ran on numba for its attention alone (a plan runs on one thread pool, native.py's
 * chosen_for), so it could not be one native program. Every kernel here gives the bytes of the NumPy and
 * numba path it replaces:
 *  - the products call the BLAS NumPy's matmul calls (NumPy's OpenBLAS; attention_native.py passes its
 *    cblas_sgemm, sgemv and sdot) the way NumPy's matmul inner loop calls it for each 2-D slice (mm():
 *    the same routine, transposition flags, shapes and leading dimensions, with NumPy's cases for a
 *    dimension of 1), so each slice's result is the same;
 *  - the row passes are the numba loops' statements in the same types and order (float64 sums in a fixed
 *    order of 8 lanes, native.h's neg_exp as exp_math.neg_exp computes it, glibc's log as numba's math.log
 *    calls it, once a row; built with -ffp-contract=off);
 *  - the head copies (split, merge) are byte copies, as np.copyto's.
 * Heads are independent, so each head's pipeline (copy, product, rows, product, copy) runs in turn on one
 * thread: the heads cut into RNB_CHUNKS blocks (fused.chunk, as the numba `par` twins cut them), the blocks
 * on rnb_parallel (pool_native.c); the flash form's pipeline is cut at its (query, key) blocks, all heads
 * in step (run_blocks says why). A head's values never depend on its thread or its neighbours.
 * Tensors are C-contiguous float32: heads (B, H, T, hd), scores (B, H, T, T), features (B, T, d) with
 * d = H hd and qkv (B, T, 3d). Nothing here allocates.
 */
#include "native.h"

enum { ROW_MAJOR = 101, COL_MAJOR = 102, NO_TRANS = 111, TRANS = 112 };

typedef void (*gemm64_t)(int, int, int, i64, i64, i64, float, const float *, i64, const float *, i64, float, float *,
                         i64);
typedef void (*gemm32_t)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *,
                         int);
typedef void (*gemv64_t)(int, int, i64, i64, float, const float *, i64, const float *, i64, float, float *, i64);
typedef void (*gemv32_t)(int, int, int, int, float, const float *, int, const float *, int, float, float *, int);
typedef float (*dot64_t)(i64, const float *, i64, const float *, i64);
typedef float (*dot32_t)(int, const float *, int, const float *, int);

/* NumPy's BLAS: fns = {cblas_sgemm, cblas_sgemv, cblas_sdot, 1 if its integers are 64-bit} */
typedef struct { void *gemm, *gemv, *dot; int wide; } blas_fns;

static blas_fns fns_of(const i64 *f) {
    blas_fns b = {(void *)(intptr_t)f[0], (void *)(intptr_t)f[1], (void *)(intptr_t)f[2], (int)f[3]};
    return b;
}

/* A 2-D float32 view as NumPy's view of it has it: rows r0 apart, columns r1 apart (in elements) */
typedef struct { float *p; i64 s0, s1; } view;

static inline view V(const float *p, i64 s0, i64 s1) { view v = {(float *)p, s0, s1}; return v; }
static inline view T_(view v) { view t = {v.p, v.s1, v.s0}; return t; }

/* matmul.c.src's is_blasable2d in elements: columns contiguous, rows at least d2 apart */
static inline int blasable(i64 s0, i64 s1, i64 d2) { return s1 == 1 && s0 >= d2; }

/* FLOAT_matmul_inner_noblas: each output summed in float32 from 0, in order */
static void mm_noblas(i64 m, i64 n, i64 p, view a, view b, view c) {
    for (i64 i = 0; i < m; i++)
        for (i64 j = 0; j < p; j++) {
            float acc = 0.0f;
            for (i64 k = 0; k < n; k++) acc += a.p[i * a.s0 + k * a.s1] * b.p[k * b.s0 + j * b.s1];
            c.p[i * c.s0 + j * c.s1] = acc;
        }
}

/* FLOAT_dot with BLAS strides: one sdot, added to a double 0 (so -0 becomes +0), rounded back */
static void mm_dot(const blas_fns *f, i64 n, const float *x, i64 incx, const float *y, i64 incy, float *out) {
    double sum = 0.0;
    if (f->wide) sum += ((dot64_t)f->dot)(n, x, incx, y, incy);
    else sum += ((dot32_t)f->dot)((int)n, x, (int)incx, y, (int)incy);
    *out = (float)sum;
}

/* FLOAT_gemv: y (m) = A (m x n, strides a0, a1) x */
static void mm_gemv(const blas_fns *f, const float *a, i64 a0, i64 a1, const float *x, i64 incx, float *y, i64 incy,
                    i64 m, i64 n) {
    int col = blasable(a0, a1, n);
    i64 lda = col ? a0 : a1;
    int order = col ? COL_MAJOR : ROW_MAJOR;
    if (f->wide) ((gemv64_t)f->gemv)(order, TRANS, n, m, 1.0f, a, lda, x, incx, 0.0f, y, incy);
    else ((gemv32_t)f->gemv)(order, TRANS, (int)n, (int)m, 1.0f, a, (int)lda, x, (int)incx, 0.0f, y, (int)incy);
}

/* FLOAT_matmul_matrixmatrix for a != b (every call here: the operands are different tensors, so never
 * NumPy's syrk case) */
static void mm_gemm(const blas_fns *f, i64 m, i64 n, i64 p, view a, view b, view c) {
    int ta = blasable(a.s0, a.s1, n) ? NO_TRANS : TRANS, tb = blasable(b.s0, b.s1, p) ? NO_TRANS : TRANS;
    i64 lda = ta == NO_TRANS ? a.s0 : a.s1, ldb = tb == NO_TRANS ? b.s0 : b.s1;
    if (f->wide)
        ((gemm64_t)f->gemm)(ROW_MAJOR, ta, tb, m, p, n, 1.0f, a.p, lda, b.p, ldb, 0.0f, c.p, c.s0);
    else
        ((gemm32_t)f->gemm)(ROW_MAJOR, ta, tb, (int)m, (int)p, (int)n, 1.0f, a.p, (int)lda, b.p, (int)ldb, 0.0f, c.p,
                            (int)c.s0);
}

/* c (m x p) = a (m x n) b (n x p): FLOAT_matmul's choice for one slice of views BLAS can address (every
 * view here: one of its strides is 1, the other at least the extent it steps over) */
static void mm(const blas_fns *f, i64 m, i64 n, i64 p, view a, view b, view c) {
    if (m == 0 || n == 0 || p == 0) { mm_noblas(m, n, p, a, b, c); return; }
    if (m == 1 || n == 1 || p == 1) {
        int a_ok = blasable(a.s0, a.s1, n) || blasable(a.s1, a.s0, m);
        int b_ok = blasable(b.s0, b.s1, p) || blasable(b.s1, b.s0, n);
        if (m == 1 && p == 1) mm_dot(f, n, a.p, a.s1, b.p, b.s0, c.p);
        else if (n == 1) mm_noblas(m, n, p, a, b, c); /* m == 1 or p == 1 with n == 1: scalar_vec */
        else if (m == 1 && b_ok && a.s1 >= 1) mm_gemv(f, b.p, b.s1, b.s0, a.p, a.s1, c.p, c.s1, p, n);
        else if (p == 1 && a_ok && b.s0 >= 1) mm_gemv(f, a.p, a.s0, a.s1, b.p, b.s0, c.p, c.s0, m, n);
        else mm_noblas(m, n, p, a, b, c);
        return;
    }
    if (c.s0 < c.s1) mm_gemm(f, p, n, m, T_(b), T_(a), T_(c)); /* matmul(a, b, c) == matmul(b.T, a.T, c.T) */
    else mm_gemm(f, m, n, p, a, b, c);
}

/* attention_kernels.CAUSAL_BLOCK: the products that sum over keys (P v, P^T dO, dS k, dS^T q) run by blocks
 * of this many queries (keys), each against only the keys (queries) on its side of the diagonal, as
 * attention_kernels.keys_before and queries_after cut them: the fully masked blocks (zeros of P, dS) are
 * never multiplied */
#define CAUSAL_BLOCK 32

/* c (T x w) = a x for a causal (T x T, rows t apart), x (T x w), by query blocks: c[b0:b1] = a[b0:b1, :b1] x[:b1]
 * (keys_before) */
static void keys_before(const blas_fns *f, const float *a, const float *x, float *c, i64 t, i64 w) {
    for (i64 b0 = 0; b0 < t; b0 += CAUSAL_BLOCK) {
        i64 b1 = min64(t, b0 + CAUSAL_BLOCK);
        mm(f, b1 - b0, b1, w, V(a + b0 * t, t, 1), V(x, w, 1), V(c + b0 * w, w, 1));
    }
}

/* c = a^T x, by key blocks: c[b0:b1] = a[b0:, b0:b1]^T x[b0:] (queries_after) */
static void queries_after(const blas_fns *f, const float *a, const float *x, float *c, i64 t, i64 w) {
    for (i64 b0 = 0; b0 < t; b0 += CAUSAL_BLOCK) {
        i64 b1 = min64(t, b0 + CAUSAL_BLOCK);
        mm(f, b1 - b0, t - b0, w, T_(V(a + b0 * t + b0, t, 1)), V(x + b0 * w, w, 1), V(c + b0 * w, w, 1));
    }
}

/* rows x width floats from src (rows ss apart) to dst (rows sd apart): np.copyto between head layouts */
static void copy_rows(float *dst, i64 sd, const float *src, i64 ss, i64 rows, i64 width) {
    for (i64 r = 0; r < rows; r++) memcpy(dst + r * sd, src + r * ss, (size_t)width * sizeof(float));
}

/* ---- row passes: attention_kernels.py's numba loops, for one head --------------------------------- */
/* Their arithmetic, the same operations in the same order as attention_kernels.py's: exp is softmax_exp (native.h's
 * neg_exp with NaN kept), not libm's, so the loops vectorise and give the same bits on every machine; sums
 * and maxima over a row run in LANES interleaved partials (element j in lane j % LANES, each lane in index
 * order from 0.0, a max from -inf) combined in one fixed tree, ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 +
 * l7)): eight independent chains pipeline where one running sum waited about 4 cycles an element. The order
 * is this one, never the compiler's (no simd reduction clauses, no fast-math). */
#define LANES 8

/* attention_kernels.softmax_exp: exp(a) for a softmax argument (<= 0, or a rounding above in
 * recompute_probs), NaN kept (neg_exp takes it as -708), so a diverged score still makes its row NaN */
static inline double softmax_exp(double a) {
    double e = neg_exp(a);
    return a == a ? e : a;
}

static inline double max2(double a, double b) { return b > a ? b : a; } /* a NaN b never wins */

static inline double lane_tree(const double *s) {
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* lane_max: max over j < n of x[j] * scale (double) in LANES; NaN never counts, an empty row gives -inf */
static double lane_max(const float *x, i64 n, double scale) {
    double m[LANES];
    for (int q = 0; q < LANES; q++) m[q] = -INFINITY;
    i64 j = 0;
    for (; j + LANES <= n; j += LANES) {
        #pragma omp simd
        for (int q = 0; q < LANES; q++) m[q] = max2(m[q], (double)x[j + q] * scale);
    }
    for (int q = 0; j + q < n; q++) m[q] = max2(m[q], (double)x[j + q] * scale);
    return max2(max2(max2(m[0], m[1]), max2(m[2], m[3])), max2(max2(m[4], m[5]), max2(m[6], m[7])));
}

/* lane_dot: sum over j < n of (double)x[j] * (double)y[j] in LANES */
static double lane_dot(const float *x, const float *y, i64 n) {
    double s[LANES] = {0.0};
    i64 j = 0;
    for (; j + LANES <= n; j += LANES) {
        #pragma omp simd
        for (int q = 0; q < LANES; q++) s[q] += (double)x[j + q] * (double)y[j + q];
    }
    for (int q = 0; j + q < n; q++) s[q] += (double)x[j + q] * (double)y[j + q];
    return lane_tree(s);
}

/* lane_sum: sum over j < n of (double)x[j] in LANES */
static double lane_sum(const float *x, i64 n) {
    double s[LANES] = {0.0};
    i64 j = 0;
    for (; j + LANES <= n; j += LANES) {
        #pragma omp simd
        for (int q = 0; q < LANES; q++) s[q] += (double)x[j + q];
    }
    for (int q = 0; j + q < n; q++) s[q] += (double)x[j + q];
    return lane_tree(s);
}

/* lane_sum's lanes over doubles, carried in s: a row can come in pieces (each but the last a multiple of LANES
 * long) and end in lane_tree(s) */
static void lane_add(double *s, const double *x, i64 n) {
    i64 j = 0;
    for (; j + LANES <= n; j += LANES) {
        #pragma omp simd
        for (int q = 0; q < LANES; q++) s[q] += x[j + q];
    }
    for (int q = 0; j + q < n; q++) s[q] += x[j + q];
}

/* Where a row's exp loops may stop: n rounded up to LANES within the row's width w. The columns past n are
 * computed and then dropped (or overwritten with 0), so the vector loop ends without a scalar tail of up to
 * LANES - 1 calls; they are in the row, and exp of any float is harmless (no traps, no errno). */
static inline i64 padded(i64 n, i64 w) { return min64((n + LANES - 1) / LANES * LANES, w); }

/* e[c] = softmax_exp(x[c] * scale - m) for c < n (double) */
static void exps(double *e, const float *x, i64 n, double scale, double m) {
    #pragma omp simd
    for (i64 c = 0; c < n; c++) e[c] = softmax_exp((double)x[c] * scale - m);
}

/* x[c] = (float)softmax_exp(x[c] * scale - m) for c < n, later columns up to w 0 */
static void exps_f32(float *x, i64 n, i64 w, double scale, double m) {
    i64 p = padded(n, w);
    #pragma omp simd
    for (i64 c = 0; c < p; c++) x[c] = (float)softmax_exp((double)x[c] * scale - m);
    for (i64 c = n; c < w; c++) x[c] = 0.0f;
}

/* causal_softmax_rows: s (T, T) = softmax over keys <= the query of scale * s, later keys 0. Each row: its max
 * m, e = exp(scale s - m) in double, their lane sum, then e * (1 / sum) rounded once to float. The numba twin
 * keeps a row of e; here a stack piece of EXP_PIECE holds them, and a longer row computes them again for the
 * last pass (the same bits). */
#define EXP_PIECE 512 /* a multiple of LANES */
static void causal_softmax(float *s, i64 t, double scale) {
    double e[EXP_PIECE];
    for (i64 i = 0; i < t; i++) {
        float *row = s + i * t;
        i64 n = i + 1;
        double m = lane_max(row, n, scale), lanes[LANES] = {0.0};
        for (i64 c0 = 0; c0 < n; c0 += EXP_PIECE) {
            i64 w = min64(EXP_PIECE, n - c0);
            exps(e, row + c0, padded(w, t - c0), scale, m);
            lane_add(lanes, e, w);
        }
        double inv = 1.0 / lane_tree(lanes);
        for (i64 c0 = 0; c0 < n; c0 += EXP_PIECE) {
            i64 w = padded(min64(EXP_PIECE, n - c0), t - c0);
            if (n > EXP_PIECE) exps(e, row + c0, w, scale, m);
            #pragma omp simd
            for (i64 c = 0; c < w; c++) row[c0 + c] = (float)(e[c] * inv);
        }
        for (i64 j = n; j < t; j++) row[j] = 0.0f;
    }
}

/* softmax_grad_rows: dp (T, T) = scale * P (dP - sum_j dP P) */
static void softmax_grad(float *dp, const float *p, i64 t, double scale) {
    for (i64 i = 0; i < t; i++) {
        float *d = dp + i * t;
        const float *pr = p + i * t;
        double s = lane_dot(d, pr, t);
        #pragma omp simd
        for (i64 j = 0; j < t; j++) d[j] = (float)(scale * (double)pr[j] * ((double)d[j] - s));
    }
}

typedef struct { /* a (query block, key block) of the flash form: rows i0.. (nq), keys j0.. (nk) */
    i64 i0, nq, j0, nk, hd;
    double scale;
} block;

/* online_step_rows: s (nq, nk) raw scores -> (float)exp(scale s - m_new) (masked keys 0); m, l, acc rescaled
 * to m_new, l plus the lane sum of the float values */
static void online_step(float *s, double *m, double *l, double *acc, const block *k) {
    i64 nq = k->nq, nk = k->nk, hd = k->hd, diag = k->i0 - k->j0; /* locals: stores could alias *k */
    double scale = k->scale;
    for (i64 r = 0; r < nq; r++) {
        float *row = s + r * nk;
        double *a = acc + r * hd;
        i64 last = min64(nk, diag + r + 1);
        double mo = m[r], mn = max2(mo, lane_max(row, last, scale));
        double corr = mo > -INFINITY ? softmax_exp(mo - mn) : 0.0;
        exps_f32(row, last, nk, scale, mn);
        l[r] = l[r] * corr + lane_sum(row, last);
        m[r] = mn;
        #pragma omp simd
        for (i64 j = 0; j < hd; j++) a[j] = a[j] * corr;
    }
}

/* finish_rows: o (the block's rows) = acc / l, lse = m + log l */
static void finish(const double *acc, const double *m, const double *l, float *o, float *lse, i64 nq, i64 hd) {
    for (i64 r = 0; r < nq; r++) {
        double inv = 1.0 / l[r];
        for (i64 j = 0; j < hd; j++) o[r * hd + j] = (float)(acc[r * hd + j] * inv);
        lse[r] = (float)(m[r] + log(l[r]));
    }
}

/* recompute_probs_rows: s (nq, nk) raw scores -> P = exp(scale s - L) (masked keys 0); lse at the block */
static void recompute_probs(float *s, const float *lse, const block *k) {
    for (i64 r = 0; r < k->nq; r++) {
        i64 last = min64(k->nk, k->i0 + r - k->j0 + 1);
        exps_f32(s + r * k->nk, last, k->nk, k->scale, (double)lse[r]);
    }
}

/* block_softmax_grad_rows: dp = scale * P (dP - D); dsum at the block */
static void block_softmax_grad(float *dp, const float *p, const float *dsum, const block *k) {
    i64 nk = k->nk;
    double scale = k->scale;
    for (i64 r = 0; r < k->nq; r++) {
        double d = (double)dsum[r];
        float *dr = dp + r * nk;
        const float *pr = p + r * nk;
        #pragma omp simd
        for (i64 c = 0; c < nk; c++) dr[c] = (float)(scale * (double)pr[c] * ((double)dr[c] - d));
    }
}

/* row_dots_rows: out[i] = sum_k a[i, k] b[i, k] in double (in lanes) */
static void row_dots(const float *a, const float *b, float *out, i64 t, i64 hd) {
    for (i64 i = 0; i < t; i++) out[i] = (float)lane_dot(a + i * hd, b + i * hd, hd);
}

static void add_f32(float *a, const float *b, i64 n) { for (i64 e = 0; e < n; e++) a[e] = a[e] + b[e]; }
static void add_f64(double *a, const float *b, i64 n) { for (i64 e = 0; e < n; e++) a[e] = a[e] + (double)b[e]; }

/* ---- the kernels: each head's pipeline, heads in RNB_CHUNKS blocks on the pool --------------------- */
typedef struct attn_job attn_job;
typedef void (*head_fn)(const attn_job *j, i64 g);

struct attn_job { /* a kernel's operands; the head functions read what their kernel passed */
    blas_fns f;
    const float *qkv, *dy, *y, *lse_in;
    float *q, *k, *v, *probs, *dprobs, *out, *o, *dout, *dq, *dk, *dv, *lse, *sblk, *dpblk, *pq, *pk, *dsum;
    double *mrow, *lrow, *acc;
    i64 b, h, t, hd, blk;
    double scale;
    head_fn head;
    block at; /* the flash form: the (query block, key block) of this pass */
};

static void heads_block(void *p, i64 c) {
    const attn_job *j = p;
    i64 g0, g1;
    chunk(j->b * j->h, c, &g0, &g1);
    for (i64 g = g0; g < g1; g++) j->head(j, g);
}

static void run_heads(attn_job *j, head_fn head, int threads) {
    j->head = head;
    rnb_parallel(threads, RNB_CHUNKS, heads_block, j); /* one thread: the blocks in order on this one */
}

/* where head g's rows start in a (B, T, width) feature tensor, at column `col` of it */
static inline i64 feature_at(const attn_job *j, i64 g, i64 width, i64 col) {
    return (g / j->h) * j->t * width + col + (g % j->h) * j->hd;
}

static void split_head(const attn_job *j, i64 g) { /* split_heads: qkv -> q, k, v of head g */
    i64 d = j->h * j->hd, th = j->t * j->hd;
    copy_rows(j->q + g * th, j->hd, j->qkv + feature_at(j, g, 3 * d, 0), 3 * d, j->t, j->hd);
    copy_rows(j->k + g * th, j->hd, j->qkv + feature_at(j, g, 3 * d, d), 3 * d, j->t, j->hd);
    copy_rows(j->v + g * th, j->hd, j->qkv + feature_at(j, g, 3 * d, 2 * d), 3 * d, j->t, j->hd);
}

static void merge_qkv_head(const attn_job *j, i64 g) { /* merge_qkv: dq, dk, dv of head g -> dqkv (j->out) */
    i64 d = j->h * j->hd, th = j->t * j->hd;
    copy_rows(j->out + feature_at(j, g, 3 * d, 0), 3 * d, j->dq + g * th, j->hd, j->t, j->hd);
    copy_rows(j->out + feature_at(j, g, 3 * d, d), 3 * d, j->dk + g * th, j->hd, j->t, j->hd);
    copy_rows(j->out + feature_at(j, g, 3 * d, 2 * d), 3 * d, j->dv + g * th, j->hd, j->t, j->hd);
}

/* bind_scores: qkv -> q, k, v; P = causal softmax of q k^T / sqrt(hd) */
static void scores_head(const attn_job *j, i64 g) {
    i64 t = j->t, hd = j->hd, th = t * hd;
    float *p = j->probs + g * t * t;
    split_head(j, g);
    mm(&j->f, t, hd, t, V(j->q + g * th, hd, 1), V(j->k + g * th, 1, hd), V(p, t, 1));
    causal_softmax(p, t, j->scale);
}

void rnb_attn_scores(const i64 *fns, const float *qkv, float *q, float *k, float *v, float *probs, i64 b, i64 h, i64 t,
                     i64 hd, double scale, int threads) {
    attn_job j = {.f = fns_of(fns), .qkv = qkv, .q = q, .k = k, .v = v, .probs = probs, .b = b, .h = h, .t = t,
                  .hd = hd, .scale = scale};
    run_heads(&j, scores_head, threads);
}

/* bind_mix: o = P v (scratch), y = merge(o) */
static void mix_head(const attn_job *j, i64 g) {
    i64 t = j->t, hd = j->hd, th = t * hd;
    float *o = j->o + g * th;
    keys_before(&j->f, j->probs + g * t * t, j->v + g * th, o, t, hd);
    copy_rows(j->out + feature_at(j, g, j->h * hd, 0), j->h * hd, o, hd, t, hd);
}

void rnb_attn_mix(const i64 *fns, const float *probs, const float *v, float *y, float *o, i64 b, i64 h, i64 t, i64 hd,
                  int threads) {
    attn_job j = {.f = fns_of(fns), .probs = (float *)probs, .v = (float *)v, .out = y, .o = o, .b = b, .h = h,
                  .t = t, .hd = hd};
    run_heads(&j, mix_head, threads);
}

/* bind_mix_bwd: dO = dy by heads (scratch), dv = P^T dO, dP = dO v^T */
static void mix_bwd_head(const attn_job *j, i64 g) {
    i64 t = j->t, hd = j->hd, th = t * hd;
    const float *p = j->probs + g * t * t;
    float *dout = j->dout + g * th;
    copy_rows(dout, hd, j->dy + feature_at(j, g, j->h * hd, 0), j->h * hd, t, hd);
    queries_after(&j->f, p, dout, j->dv + g * th, t, hd);
    mm(&j->f, t, hd, t, V(dout, hd, 1), V(j->v + g * th, 1, hd), V(j->dprobs + g * t * t, t, 1));
}

void rnb_attn_mix_bwd(const i64 *fns, const float *dy, const float *probs, const float *v, float *dprobs, float *dv,
                      float *dout, i64 b, i64 h, i64 t, i64 hd, int threads) {
    attn_job j = {.f = fns_of(fns), .dy = dy, .probs = (float *)probs, .v = (float *)v, .dprobs = dprobs, .dv = dv,
                  .dout = dout, .b = b, .h = h, .t = t, .hd = hd};
    run_heads(&j, mix_bwd_head, threads);
}

/* bind_scores_bwd: dS = scale P (dP - rowsum(dP P)) in dP's buffer; dq = dS k, dk = dS^T q; dqkv */
static void scores_bwd_head(const attn_job *j, i64 g) {
    i64 t = j->t, hd = j->hd, th = t * hd;
    float *dp = j->dprobs + g * t * t;
    softmax_grad(dp, j->probs + g * t * t, t, j->scale);
    keys_before(&j->f, dp, j->k + g * th, j->dq + g * th, t, hd);
    queries_after(&j->f, dp, j->q + g * th, j->dk + g * th, t, hd);
    merge_qkv_head(j, g);
}

void rnb_attn_scores_bwd(const i64 *fns, float *dprobs, const float *probs, const float *q, const float *k,
                         const float *dv, float *dqkv, float *dq, float *dk, i64 b, i64 h, i64 t, i64 hd, double scale,
                         int threads) {
    attn_job j = {.f = fns_of(fns), .dprobs = dprobs, .probs = (float *)probs, .q = (float *)q, .k = (float *)k,
                  .dv = (float *)dv, .out = dqkv, .dq = dq, .dk = dk, .b = b, .h = h, .t = t, .hd = hd,
                  .scale = scale};
    run_heads(&j, scores_bwd_head, threads);
}

/* ---- the flash form (bind_flash_fwd, bind_flash_bwd): query blocks against key blocks ---------------- */
/* All heads go through the blocks in step, one pool pass per (query block, key block), as the NumPy and numba
 * path does: the block scratch is block_view's, head g's part of a (BH, nq, nk) or (BH, nq, hd) view of
 * the buffer, which moves with the block's size, so two heads at blocks of different sizes would share
 * bytes of it (and the scratch would not end as the numba path leaves it). */
static void run_blocks(attn_job *j, head_fn head, int threads) {
    j->head = head;
    for (i64 i0 = 0; i0 < j->t; i0 += j->blk) {
        block k = {.i0 = i0, .nq = min64(j->blk, j->t - i0), .hd = j->hd, .scale = j->scale};
        for (k.j0 = 0; k.j0 < i0 + k.nq; k.j0 += j->blk) {
            k.nk = min64(j->blk, i0 + k.nq - k.j0);
            j->at = k;
            rnb_parallel(threads, RNB_CHUNKS, heads_block, j);
        }
    }
}

static inline int last_key_block(const block *k) { return k->j0 + k->nk == k->i0 + k->nq; }

/* One key block of a query block's forward for head g: (at the first blocks: q, k, v split out, the running
 * max, sum and accumulator reset) S = q_i k_j^T, the online step, acc += S v_j; (at the last: o and lse of
 * the query block, and after the last query block y). */
static void flash_fwd_head(const attn_job *j, i64 g) {
    const block *k = &j->at;
    i64 t = j->t, hd = j->hd, th = t * hd, nq = k->nq, nk = k->nk;
    double *m = j->mrow + g * nq, *l = j->lrow + g * nq, *acc = j->acc + g * nq * hd;
    float *s = j->sblk + g * nq * nk, *pv = j->pq + g * nq * hd;
    if (k->i0 == 0 && k->j0 == 0) split_head(j, g);
    if (k->j0 == 0) {
        for (i64 r = 0; r < nq; r++) { m[r] = -INFINITY; l[r] = 0.0; }
        for (i64 e = 0; e < nq * hd; e++) acc[e] = 0.0;
    }
    mm(&j->f, nq, hd, nk, V(j->q + g * th + k->i0 * hd, hd, 1), V(j->k + g * th + k->j0 * hd, 1, hd), V(s, nk, 1));
    online_step(s, m, l, acc, k);
    mm(&j->f, nq, nk, hd, V(s, nk, 1), V(j->v + g * th + k->j0 * hd, hd, 1), V(pv, hd, 1));
    add_f64(acc, pv, nq * hd);
    if (!last_key_block(k)) return;
    finish(acc, m, l, j->o + g * th + k->i0 * hd, j->lse + g * t + k->i0, nq, hd);
    if (k->i0 + nq == t) copy_rows(j->out + feature_at(j, g, j->h * hd, 0), j->h * hd, j->o + g * th, hd, t, hd);
}

void rnb_flash_fwd(const i64 *fns, const float *qkv, float *q, float *k, float *v, float *y, float *lse, float *sblk,
                   double *mrow, double *lrow, double *acc, float *prod, float *o, i64 b, i64 h, i64 t, i64 hd, i64 blk,
                   double scale, int threads) {
    attn_job j = {.f = fns_of(fns), .qkv = qkv, .q = q, .k = k, .v = v, .out = y, .lse = lse, .sblk = sblk,
                  .mrow = mrow, .lrow = lrow, .acc = acc, .pq = prod, .o = o, .b = b, .h = h, .t = t, .hd = hd,
                  .blk = blk, .scale = scale};
    run_blocks(&j, flash_fwd_head, threads);
}

/* The backward's first block for head g: dO and O by heads, D = rowsum(dO O), dq, dk, dv zeroed */
static void flash_bwd_start(const attn_job *j, i64 g) {
    i64 t = j->t, hd = j->hd, th = t * hd, d = j->h * hd;
    float *dout = j->dout + g * th, *out = j->o + g * th;
    copy_rows(dout, hd, j->dy + feature_at(j, g, d, 0), d, t, hd);
    copy_rows(out, hd, j->y + feature_at(j, g, d, 0), d, t, hd);
    row_dots(dout, out, j->dsum + g * t, t, hd);
    memset(j->dq + g * th, 0, (size_t)th * sizeof(float));
    memset(j->dk + g * th, 0, (size_t)th * sizeof(float));
    memset(j->dv + g * th, 0, (size_t)th * sizeof(float));
}

/* One (query block, key block) of the backward for head g: P recomputed, dv_j += P^T dO_i,
 * dS = P (dO_i v_j^T - D), dq_i += dS k_j, dk_j += dS^T q_i; after the last block, dqkv. */
static void flash_bwd_head(const attn_job *j, i64 g) {
    const block *k = &j->at;
    i64 hd = j->hd, th = j->t * hd, nq = k->nq, nk = k->nk;
    float *s = j->sblk + g * nq * nk, *dp = j->dpblk + g * nq * nk, *tq = j->pq + g * nq * hd, *tk = j->pk + g * nk * hd;
    const float *qi = j->q + g * th + k->i0 * hd, *kj = j->k + g * th + k->j0 * hd, *vj = j->v + g * th + k->j0 * hd;
    const float *doi = j->dout + g * th + k->i0 * hd;
    if (k->i0 == 0 && k->j0 == 0) flash_bwd_start(j, g);
    mm(&j->f, nq, hd, nk, V(qi, hd, 1), V(kj, 1, hd), V(s, nk, 1));
    recompute_probs(s, j->lse_in + g * j->t + k->i0, k);
    mm(&j->f, nk, nq, hd, T_(V(s, nk, 1)), V(doi, hd, 1), V(tk, hd, 1));
    add_f32(j->dv + g * th + k->j0 * hd, tk, nk * hd);
    mm(&j->f, nq, hd, nk, V(doi, hd, 1), V(vj, 1, hd), V(dp, nk, 1));
    block_softmax_grad(dp, s, j->dsum + g * j->t + k->i0, k);
    mm(&j->f, nq, nk, hd, V(dp, nk, 1), V(kj, hd, 1), V(tq, hd, 1));
    add_f32(j->dq + g * th + k->i0 * hd, tq, nq * hd);
    mm(&j->f, nk, nq, hd, T_(V(dp, nk, 1)), V(qi, hd, 1), V(tk, hd, 1));
    add_f32(j->dk + g * th + k->j0 * hd, tk, nk * hd);
    if (last_key_block(k) && k->i0 + nq == j->t) merge_qkv_head(j, g);
}

void rnb_flash_bwd(const i64 *fns, const float *dy, const float *y, const float *q, const float *k, const float *v,
                   const float *lse, float *dqkv, float *dq, float *dk, float *dv, float *sblk, float *dpblk, float *pq,
                   float *pk, float *dout, float *o, float *dsum, i64 b, i64 h, i64 t, i64 hd, i64 blk, double scale,
                   int threads) {
    attn_job j = {.f = fns_of(fns), .dy = dy, .y = y, .q = (float *)q, .k = (float *)k, .v = (float *)v,
                  .lse_in = lse, .out = dqkv, .dq = dq, .dk = dk, .dv = dv, .sblk = sblk, .dpblk = dpblk, .pq = pq,
                  .pk = pk, .dout = dout, .o = o, .dsum = dsum, .b = b, .h = h, .t = t, .hd = hd, .blk = blk,
                  .scale = scale};
    run_blocks(&j, flash_bwd_head, threads);
}
