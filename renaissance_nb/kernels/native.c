/* The CPU replay's fused passes in C: the same loops as the numba kernels of fused.py, blas.py and
 * philox.py, compiled once per machine by the system C compiler (kernels/native_build.py), so a first run
 * does not wait for numba to compile them.
 *
 * Every function gives the bytes of its numba twin (tests/test_native.py compares them): the same
 * types at every step (float32 where numba keeps float32, double where a Python float literal or
 * argument makes numba widen), the same order of additions, the same cuts of a range into
 * RNB_CHUNKS blocks. It is built with -ffp-contract=off (no fused multiply-adds, as numba without
 * fastmath) and without -ffast-math; expf and tanhf are glibc's, as numba's are. Threads: rnb_parallel
 * (pool_native.c), one block of a pass per claim, so the thread count never changes a byte.
 * Arrays are raw addresses; 2-D ones take a row stride in elements. Nothing here allocates.
 */
#include "native.h"

int rnb_abi(void) { return 7; }
int rnb_chunks(void) { return RNB_CHUNKS; } /* native_build.py checks it is operands.PAR_CHUNKS: every pass cuts its range so */

/* A thread pool does not survive fork(): a forked child that waited on the parent's workers would
 * hang. After a fork every pass here runs on the calling thread (the same bytes: a block's
 * work never depends on the thread that does it). */
volatile int rnb_forked = 0;
static void in_child(void) { rnb_forked = 1; }
__attribute__((constructor)) static void watch_forks(void) { pthread_atfork(NULL, NULL, in_child); }

/* ---- bias + activation (fused.bias_act_) ----------------------------------------------------- */
static void bias_act_rows(float *y, i64 ldy, i64 r0, i64 r1, i64 m, const float *b, i64 nb, i64 act, double slope) {
    for (i64 i = r0; i < r1; i++) {
        float *row = y + i * ldy;
        for (i64 j = 0; j < m; j++) {
            float z = row[j];
            if (nb > 0) z += b[j];
            double r = z; /* numba unifies z to float64 where a branch widens it */
            if (act == 1) { if (z <= 0) r = 0.0; } /* numba's compiled select gives +0 for -0 */
            else if (act == 2) r = tanhf(z);
            else if (act == 3) r = 1.0 / (1.0 + (double)expf(-z));
            else if (act == 4) { if (z < 0) r = (double)z * slope; }
            row[j] = (float)r;
        }
    }
}

typedef struct { /* the arguments of a pass, for its blocks (rnb_parallel: pool_native.c) */
    float *y, *d, *w, *g, *m, *v, *parts32;
    const float *x, *b, *yc;
    double *parts;
    i64 n, cols, ldy, ldd, nb, act, blocks, nout;
    double slope;
    const void *k; /* a pass's constants (adam_consts) */
} pass_args;

static void bias_act_block(void *p, i64 t) {
    const pass_args *a = p;
    bias_act_rows(a->y, a->ldy, cut(a->n, RNB_CHUNKS, t), cut(a->n, RNB_CHUNKS, t + 1), a->cols, a->b, a->nb, a->act,
                  a->slope);
}

void rnb_bias_act(float *y, i64 n, i64 m, i64 ldy, const float *b, i64 nb, i64 act, double slope, int threads) {
    threads = team(threads);
    if (threads <= 1) { bias_act_rows(y, ldy, 0, n, m, b, nb, act, slope); return; }
    pass_args a = {.y = y, .n = n, .cols = m, .ldy = ldy, .b = b, .nb = nb, .act = act, .slope = slope};
    rnb_parallel(threads, RNB_CHUNKS, bias_act_block, &a);
}

/* ---- activation gradient + bias column sums (fused.act_grad_colsum_) ------------------------- */
static void act_grad_row(float *row, const float *yr, i64 m, i64 act, double slope) {
    if (act == 1) { for (i64 j = 0; j < m; j++) row[j] = yr[j] > 0 ? row[j] : 0.0f; }
    else if (act == 2) { for (i64 j = 0; j < m; j++) row[j] = row[j] * (1.0f - yr[j] * yr[j]); }
    else if (act == 3) { for (i64 j = 0; j < m; j++) row[j] = row[j] * (yr[j] * (1.0f - yr[j])); }
    else if (act == 4) {
        for (i64 j = 0; j < m; j++) { float dj = row[j]; row[j] = yr[j] > 0 ? dj : (float)((double)dj * slope); }
    }
}

static void act_grad_block(float *d, i64 ldd, const float *y, i64 ldy, i64 m, i64 r0, i64 r1, i64 act, double slope,
                           double *acc, i64 nacc) {
    for (i64 j = 0; j < nacc; j++) acc[j] = 0.0;
    i64 i = r0;
    while (i < r1) {
        i64 n = min64(8, r1 - i);
        if (act != 0)
            for (i64 k = i; k < i + n; k++) act_grad_row(d + k * ldd, y + k * ldy, m, act, slope);
        if (nacc > 0) {
            if (n == 8) { /* fused._add_eight_rows: eight rows added pairwise in double */
                const float *r[8];
                for (int q = 0; q < 8; q++) r[q] = d + (i + q) * ldd;
                for (i64 j = 0; j < nacc; j++)
                    acc[j] += ((((double)r[0][j] + (double)r[1][j]) + ((double)r[2][j] + (double)r[3][j]))
                               + (((double)r[4][j] + (double)r[5][j]) + ((double)r[6][j] + (double)r[7][j])));
            } else {
                for (i64 k = i; k < i + n; k++) {
                    const float *row = d + k * ldd;
                    for (i64 j = 0; j < nacc; j++) acc[j] += row[j];
                }
            }
        }
        i += n;
    }
}

static void act_grad_colsum_block(void *p, i64 t) {
    const pass_args *a = p;
    act_grad_block(a->d, a->ldd, a->yc, a->ldy, a->cols, cut(a->n, a->blocks, t), cut(a->n, a->blocks, t + 1), a->act,
                   a->slope, a->parts + t * a->nout, a->nout);
}

void rnb_act_grad_colsum(float *d, i64 rows, i64 m, i64 ldd, const float *y, i64 ldy, i64 act, double slope,
                         double *parts, i64 blocks, float *out, i64 nout, int threads) {
    pass_args a = {.d = d, .n = rows, .cols = m, .ldd = ldd, .yc = y, .ldy = ldy, .act = act, .slope = slope,
                   .parts = parts, .blocks = blocks, .nout = nout};
    rnb_parallel(threads, blocks, act_grad_colsum_block, &a);
    for (i64 j = 0; j < nout; j++) { /* fused.fold_blocks */
        double s = 0.0;
        for (i64 t = 0; t < blocks; t++) s += parts[t * nout + j];
        out[j] = (float)s;
    }
}

/* ---- optimizers (fused.adam_update, fused.sgd_update) ------------------------------------------ */
static inline float flush32(float x) { return fabsf(x) < RNB_TINY32 ? 0.0f : x; }

static double powi(double a, i64 e) { /* numba's float ** int: exponentiation by squaring */
    double r = 1.0;
    if (e > 0x10000) return pow(a, (double)e);
    while (e != 0) {
        if (e & 1) r *= a;
        e >>= 1;
        a *= a;
    }
    return r;
}

typedef struct {
    float step_size, bc2, decay, wd32, b2, lerp_w, one_b2, eps;
    double weight_decay;
    int decoupled, maximize, from_end;
} adam_consts;

static void adam_range(float *w, float *g, float *m, float *v, i64 lo, i64 hi, const adam_consts *k) {
    for (i64 j = lo; j < hi; j++) {
        float gk = g[j];
        if (k->maximize) gk = -gk;
        float wk = w[j];
        if (k->decoupled) wk = wk * k->decay;
        else if (k->weight_decay != 0.0) gk = gk + k->wd32 * wk;
        float mj = m[j];
        float mk = flush32(k->from_end ? gk - (gk - mj) * k->lerp_w : mj + (gk - mj) * k->lerp_w);
        float vk = flush32(v[j] * k->b2 + k->one_b2 * gk * gk);
        m[j] = mk;
        v[j] = vk;
        float denom = sqrtf(vk) / k->bc2 + k->eps;
        w[j] = wk - k->step_size * (mk / denom);
    }
}

static void adam_block(void *p, i64 c) {
    const pass_args *a = p;
    i64 lo, hi;
    chunk(a->n, c, &lo, &hi);
    adam_range(a->w, a->g, a->m, a->v, lo, hi, a->k);
}

void rnb_adam(float *w, float *g, float *m, float *v, i64 n, const float *lr_table, i64 nlr, i64 *step,
              double beta1, double beta2, double eps, double weight_decay, int decoupled, int maximize, int threads) {
    threads = team(threads);
    i64 t0 = step[0];
    double lr = (double)lr_table[min64(t0, nlr - 1)];
    i64 t = t0 + 1;
    double bc1 = 1.0 - powi(beta1, t);
    double bc2_sqrt = sqrt(1.0 - powi(beta2, t));
    adam_consts k;
    k.step_size = (float)(lr / bc1);
    k.bc2 = (float)bc2_sqrt;
    k.decay = (float)(1.0 - lr * weight_decay);
    k.wd32 = (float)weight_decay;
    k.b2 = (float)beta2;
    float one_b1 = (float)(1.0 - beta1);
    k.one_b2 = (float)(1.0 - beta2);
    k.eps = (float)eps;
    k.weight_decay = weight_decay;
    k.decoupled = decoupled;
    k.maximize = maximize;
    k.from_end = !(fabsf(one_b1) < 0.5f);
    k.lerp_w = k.from_end ? 1.0f - one_b1 : one_b1;
    pass_args a = {.w = w, .g = g, .m = m, .v = v, .n = n, .k = &k};
    rnb_parallel(threads, RNB_CHUNKS, adam_block, &a);
    step[0] = t0 + 1;
}

/* step[0] -= 1: AdamW(decay="matrices") is two rnb_adam passes, each counting the step (optim/adam.py) */
void rnb_count_back(i64 *step) { step[0] -= 1; }

typedef struct {
    float lr32, mom, damp, wd;
    double weight_decay;
    int first, use_m, nesterov, maximize;
} sgd_consts;

static void sgd_block(void *p, i64 c) {
    const pass_args *a = p;
    const sgd_consts *q = a->k;
    float *w = a->w, *g = a->g, *m = a->m;
    i64 lo, hi;
    chunk(a->n, c, &lo, &hi);
    for (i64 k = lo; k < hi; k++) {
        float gk = g[k];
        if (q->maximize) gk = -gk;
        if (q->weight_decay != 0.0) gk = gk + q->wd * w[k];
        if (q->use_m) {
            float buf = q->first ? flush32(gk) : flush32(q->mom * m[k] + q->damp * gk);
            m[k] = buf;
            gk = q->nesterov ? gk + q->mom * buf : buf;
        }
        w[k] = w[k] - q->lr32 * gk;
    }
}

void rnb_sgd(float *w, float *g, float *m, i64 n, i64 nm, const float *lr_table, i64 nlr, i64 *step, double momentum,
             double dampening, double weight_decay, int nesterov, int maximize, int threads) {
    threads = team(threads);
    i64 t = step[0];
    float lr32 = lr_table[min64(t, nlr - 1)];
    float mom = (float)momentum, damp = (float)(1.0 - dampening), wd = (float)weight_decay;
    sgd_consts k = {lr32, mom, damp, wd, weight_decay, t == 0, nm > 0, nesterov, maximize};
    pass_args a = {.w = w, .g = g, .m = m, .n = n, .k = &k};
    rnb_parallel(threads, RNB_CHUNKS, sgd_block, &a);
    step[0] = t + 1;
}

/* fused.ema_: e = d * e + (1 - d) * w in float32 */
void rnb_ema(float *e, const float *w, i64 n, double decay) {
    float d = (float)decay, one_d = (float)(1.0 - decay);
    for (i64 j = 0; j < n; j++) e[j] = d * e[j] + one_d * w[j];
}

/* ---- gradient checks (fused.nonfinite_probe, sq_sum, scale_) ------------------------------------- */
static float probe_range(const float *x, i64 n) { /* sum of x - x: 0 when all finite, NaN otherwise */
    float s = 0.0f;
    #pragma omp simd reduction(+ : s)
    for (i64 k = 0; k < n; k++) s += x[k] - x[k];
    return s;
}

static void probe_block(void *p, i64 c) {
    const pass_args *a = p;
    i64 lo, hi;
    chunk(a->n, c, &lo, &hi);
    a->parts32[c] = probe_range(a->x + lo, hi - lo);
}

float rnb_nonfinite_probe(const float *x, i64 n, float *parts, int threads) {
    pass_args a = {.x = x, .n = n, .parts32 = parts};
    rnb_parallel(threads, RNB_CHUNKS, probe_block, &a);
    float s = 0.0f;
    for (int c = 0; c < RNB_CHUNKS; c++) s += parts[c];
    return s;
}

/* fused.sq_sum: eight accumulators in a written-out order (element i into i % 8), no reassociation,
 * so the same float64 as numba's; the chunks added in order (fused.sq_sum_par). */
static double sq_sum_range(const float *x, i64 n) {
    i64 q = n - n % 8;
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (i64 i = 0; i < q; i += 8) {
        double v0 = x[i], v1 = x[i + 1], v2 = x[i + 2], v3 = x[i + 3];
        double v4 = x[i + 4], v5 = x[i + 5], v6 = x[i + 6], v7 = x[i + 7];
        a0 += v0 * v0; a1 += v1 * v1; a2 += v2 * v2; a3 += v3 * v3;
        a4 += v4 * v4; a5 += v5 * v5; a6 += v6 * v6; a7 += v7 * v7;
    }
    for (i64 i = q; i < n; i++) { double v = x[i]; a0 += v * v; }
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
}

static void sq_sum_block(void *p, i64 c) {
    const pass_args *a = p;
    i64 lo, hi;
    chunk(a->n, c, &lo, &hi);
    a->parts[c] = sq_sum_range(a->x + lo, hi - lo);
}

double rnb_sq_sum(const float *x, i64 n, int threads) {
    double part[RNB_CHUNKS];
    pass_args a = {.x = x, .n = n, .parts = part};
    rnb_parallel(threads, RNB_CHUNKS, sq_sum_block, &a);
    double total = 0.0;
    for (int c = 0; c < RNB_CHUNKS; c++) total += part[c];
    return total;
}

static void scale_block(void *p, i64 c) {
    const pass_args *a = p;
    i64 lo, hi;
    chunk(a->n, c, &lo, &hi);
    float factor = (float)a->slope;
    for (i64 i = lo; i < hi; i++) a->y[i] = a->y[i] * factor;
}

void rnb_scale(float *x, i64 n, float factor, int threads) {
    pass_args a = {.y = x, .n = n, .slope = factor};
    rnb_parallel(threads, RNB_CHUNKS, scale_block, &a);
}

/* ---- LARS (fused.lars_norms, lars_update; renaissance_nb/optim/lars.py) ------------------------------------ */
static double sq_sum_chunked(const float *x, i64 n) { /* fused.sq_sum_chunked: the chunks in order, one thread */
    double total = 0.0;
    for (i64 c = 0; c < RNB_CHUNKS; c++) {
        i64 lo, hi;
        chunk(n, c, &lo, &hi);
        total += sq_sum_range(x + lo, hi - lo);
    }
    return total;
}

typedef struct {
    const float *w, *g;
    float *nrm;
    const i64 *seg;
} lars_norms_job;

static void lars_norm_block(void *v, i64 q) {
    const lars_norms_job *a = v;
    const i64 *s = a->seg + 3 * (q / 2);
    const float *x = (q % 2 == 0 ? a->w : a->g) + s[0];
    a->nrm[s[2] + q % 2] = (float)sqrt(sq_sum_chunked(x, s[1]));
}

/* seg[i] = (offset in W and G, size, offset of the norm pair in nrm); one norm per block */
void rnb_lars_norms(const float *w, const float *g, float *nrm, const i64 *seg, i64 k, int threads) {
    lars_norms_job a = {w, g, nrm, seg};
    rnb_parallel(threads, 2 * k, lars_norm_block, &a);
}

static float lars_trust(const float *nrm, i64 at, double eta, double wd, double eps) {
    double wn = nrm[at], gn = nrm[at + 1];
    if (wn > 0.0 && gn > 0.0) return (float)(eta * wn / (gn + wd * wn + eps));
    return 1.0f;
}

typedef struct {
    float *w, *m;
    const float *g, *nrm;
    const i64 *pieces;
    i64 n, np;
    float lr32, mom, wd32;
    double eta, wd, eps;
} lars_job;

static void lars_block(void *v, i64 c) {
    const lars_job *q = v;
    i64 lo, hi;
    chunk(q->n, c, &lo, &hi);
    for (i64 k = 0; k < q->np; k++) {
        const i64 *p = q->pieces + 3 * k;
        i64 a = p[0] > lo ? p[0] : lo, b = p[1] < hi ? p[1] : hi, at = p[2];
        if (a >= b) continue;
        float scale = at >= 0 ? lars_trust(q->nrm, at, q->eta, q->wd, q->eps) : 1.0f;
        for (i64 j = a; j < b; j++) {
            float gk = q->g[j];
            if (at >= 0) gk = scale * (gk + q->wd32 * q->w[j]);
            float buf = flush32(q->mom * q->m[j] + gk);
            q->m[j] = buf;
            q->w[j] = q->w[j] - q->lr32 * buf;
        }
    }
}

/* pieces[k] = (start, end, norm offset or -1): an adapted weight or a run of excluded values */
void rnb_lars(float *w, const float *g, float *m, i64 n, const float *nrm, const i64 *pieces, i64 np,
              const float *lr_table, i64 nlr, i64 *step, double momentum, double wd, double eta, double eps,
              int threads) {
    i64 t = step[0];
    lars_job q = {.w = w, .m = m, .g = g, .nrm = nrm, .pieces = pieces, .n = n, .np = np,
                  .lr32 = lr_table[min64(t, nlr - 1)], .mom = (float)momentum, .wd32 = (float)wd,
                  .eta = eta, .wd = wd, .eps = eps};
    rnb_parallel(threads, RNB_CHUNKS, lars_block, &q);
    step[0] = t + 1;
}

/* ---- batch gather (fused.gather_batch) --------------------------------------------------------- */
typedef struct {
    const char *x_src, *y_src;
    const i64 *rows;
    char *x_out, *y_out;
    i64 n, rb, yitem;
} gather_args;

static void gather_block(void *p, i64 t) {
    const gather_args *a = p;
    for (i64 i = cut(a->n, RNB_CHUNKS, t); i < cut(a->n, RNB_CHUNKS, t + 1); i++) {
        i64 r = a->rows[i];
        memcpy(a->x_out + i * a->rb, a->x_src + r * a->rb, (size_t)a->rb);
        memcpy(a->y_out + i * a->yitem, a->y_src + r * a->yitem, (size_t)a->yitem);
    }
}

/* x rows of `d` elements of `item` bytes (float32 images, or uint8 before a cast on the device) */
i64 rnb_gather(const char *x_src, i64 rows, i64 d, i64 item, const char *y_src, i64 yitem, const i64 *perm, i64 nperm,
               i64 *cursor, char *x_out, char *y_out, i64 n, int threads) {
    threads = team(threads);
    i64 start = cursor[0];
    i64 status = batch_status(perm, nperm, start, n, rows);
    if (status) return status;
    gather_args a = {x_src, y_src, perm + start, x_out, y_out, n, d * item, yitem};
    rnb_parallel(threads, RNB_CHUNKS, gather_block, &a);
    cursor[0] = start + n;
    return 0;
}

/* ---- loss and metrics (fused.softmax_xent, accumulate_metrics) ---------------------------------- */
static inline int ranks_ahead(float z, i64 j, float zy, i64 y) {
    if (z != z) return zy == zy || j < y;
    return z > zy || (z == zy && j < y);
}

static inline i64 label_at(const void *labels, int wide, i64 i) {
    return wide ? ((const i64 *)labels)[i] : (i64)((const int32_t *)labels)[i];
}

/* labels: int64 (wide) or int32 */
void rnb_softmax_xent(const float *logits, i64 n, i64 c, i64 ldl, const void *labels, int wide, double smoothing,
                      const float *weight, i64 nw, float *result, float *dlogits, i64 ldd, int want_grad) {
    int weighted = nw > 0;
    double total = 0.0, top1 = 0.0, top5 = 0.0, inv_n = 1.0 / (double)n, wsum = 0.0;
    if (weighted) {
        double norm = 0.0;
        for (i64 i = 0; i < n; i++) norm += (double)weight[label_at(labels, wide, i)];
        inv_n = norm != 0.0 ? 1.0 / norm : 0.0;
        for (i64 j = 0; j < c; j++) wsum += (double)weight[j];
    }
    double off = smoothing / (double)c, on = 1.0 - smoothing;
    for (i64 i = 0; i < n; i++) {
        const float *row = logits + i * ldl;
        i64 y = label_at(labels, wide, i);
        float mx = row[0];
        for (i64 j = 1; j < c; j++)
            if (row[j] > mx) mx = row[j];
        double s = 0.0;
        for (i64 j = 0; j < c; j++) s += exp((double)row[j] - (double)mx);
        double lse = (double)mx + log(s);
        double wy = 0.0;
        if (weighted) {
            wy = (double)weight[y];
            double wz = 0.0;
            for (i64 j = 0; j < c; j++) wz += (double)weight[j] * (double)row[j];
            total += on * wy * (lse - (double)row[y]) + off * (wsum * lse - wz);
        } else {
            double zsum = 0.0;
            for (i64 j = 0; j < c; j++) zsum += (double)row[j];
            total += on * (lse - (double)row[y]) + off * ((double)c * lse - zsum);
        }
        float zy = row[y];
        i64 better = 0;
        for (i64 j = 0; j < c; j++) better += ranks_ahead(row[j], j, zy, y);
        if (better == 0) top1 += 1.0;
        if (better < 5) top5 += 1.0;
        if (want_grad) {
            float *drow = dlogits + i * ldd;
            for (i64 j = 0; j < c; j++) {
                double p = exp((double)row[j] - lse), dd;
                if (weighted) dd = on * wy * (p - (j == y ? 1.0 : 0.0)) + off * (p * wsum - (double)weight[j]);
                else dd = p - (off + (j == y ? on : 0.0));
                drow[j] = (float)(dd * inv_n);
            }
        }
    }
    result[0] = (float)(total * inv_n);
    result[1] = (float)top1;
    result[2] = (float)top5;
}

void rnb_accumulate_metrics(const float *result, double *acc, double batch, float *loss_log, i64 nlog, const i64 *step) {
    acc[0] += (double)result[0] * batch;
    acc[1] += result[1];
    acc[2] += result[2];
    acc[3] += batch;
    if (nlog > 0 && step[0] < nlog) loss_log[step[0]] = result[0];
}

/* ---- matrix products (blas._bands64/_bands32): one sgemm per band, bands on threads ---------------- */
typedef void (*sgemm64_t)(int, int, int, i64, i64, i64, float, const float *, i64, const float *, i64, float, float *, i64);
typedef void (*sgemm32_t)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);

static void band(void *fptr, int wide, const i64 *r) {
    if (wide)
        ((sgemm64_t)fptr)(101, (int)r[0], (int)r[1], r[2], r[3], r[4], 1.0f, (const float *)r[5], r[6],
                          (const float *)r[7], r[8], 0.0f, (float *)r[9], r[10]);
    else
        ((sgemm32_t)fptr)(101, (int)r[0], (int)r[1], (int)r[2], (int)r[3], (int)r[4], 1.0f, (const float *)r[5],
                          (int)r[6], (const float *)r[7], (int)r[8], 0.0f, (float *)r[9], (int)r[10]);
}

typedef struct {
    void *fptr;
    int wide;
    const i64 *bands;
} band_args;

static void band_block(void *p, i64 t) {
    const band_args *a = p;
    band(a->fptr, a->wide, a->bands + 11 * t);
}

void rnb_gemm_bands(void *fptr, int wide, const i64 *bands, i64 nbands, int threads) {
    threads = team(threads);
    if (nbands == 1 || threads <= 1) {
        for (i64 t = 0; t < nbands; t++) band(fptr, wide, bands + 11 * t);
        return;
    }
    band_args a = {fptr, wide, bands};
    rnb_parallel(threads, nbands, band_block, &a);
}

/* ---- Philox4x32-10 sort keys (philox.keys_kernel) ---------------------------------------------- */
void rnb_philox_keys(uint64_t *out, i64 n, uint64_t k0, uint64_t k1, uint64_t stream, uint64_t off_lo, uint64_t off_hi) {
    uint64_t base = (off_hi << 32) | off_lo, w[4];
    for (i64 b = 0; b < n / 2; b++) {
        uint64_t blk = base + (uint64_t)b;
        philox_block(blk & 0xFFFFFFFFull, blk >> 32, stream, 0, k0, k1, w);
        out[2 * b] = (w[0] << 32) | w[1];
        out[2 * b + 1] = (w[2] << 32) | w[3];
    }
    if (n % 2) {
        uint64_t blk = base + (uint64_t)(n / 2);
        philox_block(blk & 0xFFFFFFFFull, blk >> 32, stream, 0, k0, k1, w);
        out[n - 1] = (w[0] << 32) | w[1];
    }
}
