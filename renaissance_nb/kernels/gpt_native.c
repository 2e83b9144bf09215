/* The GPT's layer norm and embeddings in C: the twins of ops/layernorm.py (ln_fwd_rows_, ln_fwd_,
 * ln_bwd_rows_, ln_param_grads_) and ops/embedding.py (gather_rows_, gather_par_, scatter_add_, add_rows_,
 * batch_sum_, add_row_at_), with the token windows' gather (fused.gather_token_windows), the per-position
 * loss's division (cpu._per_position) and the decode step's attention (attention_kernels.attn_decode_);
 * kernels/gpt_native.py binds them, tests/test_gpt_native.py and test_gpt_program.py compare their bytes.
 *
 * Why: a plan runs on one thread pool (native.chosen_for), so while a GPT's layer norms and embeddings
 * were numba's only, its whole CPU step stayed on numba. As native.c: the same types at every step as
 * numba's (double where a float64 operand or literal widens, float32 where numba keeps float32), every
 * sum in the numba loop's index order, built with -ffp-contract=off. Threads: rnb_parallel (pool_native.c)
 * over the RNB_CHUNKS blocks of native.h's chunk(), numba's chunk(); a block's values never depend on the
 * thread that computes it. No `restrict` where an output may be its input (an in-place pass: each element
 * is then read before it is written, as in the numba loops); only the scatter-add's float64 sums, a scratch
 * of their own, are declared apart. Nothing here allocates.
 */
#include "native.h"

/* ---- layer norm (ops/layernorm.py) ------------------------------------------------------------ */
typedef struct {
    const float *x, *w, *b, *dy, *mean_in, *rstd_in;
    float *y, *mean, *rstd, *dx;
    double *part, eps;
    i64 rows, d, chunks;
} ln_pass;

#define LN_GROUP 8 /* rows whose float64 sums run side by side: eight independent chains, each in its row's order */

/* ln_fwd_rows_ for rows r0.. r0 + LN_GROUP: each row's sums over k in index order, as one row alone gives them,
 * the LN_GROUP chains interleaved (one dependent add after another was the pass's whole cost) */
static void ln_fwd_group(const ln_pass *a, i64 r0) {
    i64 d = a->d;
    const float *x = a->x + r0 * d;
    double s[LN_GROUP] = {0}, v[LN_GROUP] = {0}, m[LN_GROUP], inv[LN_GROUP];
    for (i64 k = 0; k < d; k++) {
        #pragma GCC unroll 8
        for (int j = 0; j < LN_GROUP; j++) s[j] += (double)x[j * d + k];
    }
    for (int j = 0; j < LN_GROUP; j++) m[j] = s[j] / (double)d;
    for (i64 k = 0; k < d; k++) {
        #pragma GCC unroll 8
        for (int j = 0; j < LN_GROUP; j++) {
            double z = (double)x[j * d + k] - m[j];
            v[j] += z * z;
        }
    }
    for (int j = 0; j < LN_GROUP; j++) {
        inv[j] = 1.0 / sqrt(v[j] / (double)d + a->eps);
        a->mean[r0 + j] = (float)m[j];
        a->rstd[r0 + j] = (float)inv[j];
    }
    const float *w = a->w, *b = a->b;
    for (int j = 0; j < LN_GROUP; j++) {
        const float *xr = x + j * d;
        float *yr = a->y + (r0 + j) * d;
        double mj = m[j], ij = inv[j];
        for (i64 k = 0; k < d; k++) yr[k] = (float)(((double)xr[k] - mj) * ij * (double)w[k] + (double)b[k]);
    }
}

/* ln_fwd_rows_: rows lo..hi of y = (x - mean) / sqrt(var + eps) * w + b; mean and 1/std saved (float32).
 * The struct's fields are read into locals once: a store through y could otherwise be the struct's, and the
 * compiler would reload them every element (and not vectorise the last loop) */
static void ln_fwd_rows(const ln_pass *a, i64 lo, i64 hi) {
    i64 d = a->d;
    const float *x = a->x, *w = a->w, *b = a->b;
    float *y = a->y, *mean = a->mean, *rstd = a->rstd;
    double eps = a->eps;
    for (; lo + LN_GROUP <= hi; lo += LN_GROUP) ln_fwd_group(a, lo);
    for (i64 r = lo; r < hi; r++) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        double s = 0.0;
        for (i64 k = 0; k < d; k++) s += (double)xr[k];
        double m = s / (double)d;
        double v = 0.0;
        for (i64 k = 0; k < d; k++) {
            double z = (double)xr[k] - m;
            v += z * z;
        }
        double inv = 1.0 / sqrt(v / (double)d + eps);
        mean[r] = (float)m;
        rstd[r] = (float)inv;
        for (i64 k = 0; k < d; k++) yr[k] = (float)(((double)xr[k] - m) * inv * (double)w[k] + (double)b[k]);
    }
}

static void ln_fwd_block(void *p, i64 c) {
    const ln_pass *a = p;
    i64 lo, hi;
    chunk(a->rows, c, &lo, &hi);
    ln_fwd_rows(a, lo, hi);
}

/* ln_fwd_ (and ln_fwd_rows_ over every row: the same bytes per row): x, y (rows, d) contiguous */
void rnb_ln_fwd(const float *x, i64 rows, i64 d, const float *w, const float *b, float *y, float *mean, float *rstd,
                double eps, int threads) {
    ln_pass a = {.x = x, .w = w, .b = b, .y = y, .mean = mean, .rstd = rstd, .eps = eps, .rows = rows, .d = d};
    rnb_parallel(threads, RNB_CHUNKS, ln_fwd_block, &a);
}

/* ln_bwd_rows_ for rows r0.. r0 + LN_GROUP: their dx (dx NULL: none) and their terms added into the block's
 * partials pw, pb, at every k the rows in order (as one row at a time adds them); each row's two sums in its own
 * index order, the chains interleaved as in ln_fwd_group */
static void ln_bwd_group(const ln_pass *a, i64 r0, double *pw, double *pb) {
    i64 d = a->d;
    const float *x = a->x + r0 * d, *dy = a->dy + r0 * d, *w = a->w;
    double m[LN_GROUP], inv[LN_GROUP], sg[LN_GROUP] = {0}, sgx[LN_GROUP] = {0};
    for (int j = 0; j < LN_GROUP; j++) {
        m[j] = (double)a->mean_in[r0 + j];
        inv[j] = (double)a->rstd_in[r0 + j];
    }
    for (i64 k = 0; k < d; k++) {
        double wk = (double)w[k];
        #pragma GCC unroll 8
        for (int j = 0; j < LN_GROUP; j++) {
            double gy = (double)dy[j * d + k], xh = ((double)x[j * d + k] - m[j]) * inv[j], g = gy * wk;
            sg[j] += g;
            sgx[j] += g * xh;
        }
    }
    for (int j = 0; j < LN_GROUP; j++) { /* rows in order into each k's partials, as one row at a time adds them */
        const float *xr = x + j * d, *gr = dy + j * d;
        double mj = m[j], ij = inv[j], a1 = sg[j] / (double)d, a2 = sgx[j] / (double)d;
        for (i64 k = 0; k < d; k++) {
            double gy = (double)gr[k];
            pw[k] += gy * (((double)xr[k] - mj) * ij);
            pb[k] += gy;
        }
        if (a->dx == NULL) continue;
        float *o = a->dx + (r0 + j) * d; /* a loop of its own: with the partials' it ran 1.7x slower (no vectors) */
        for (i64 k = 0; k < d; k++) {
            double xh = ((double)xr[k] - mj) * ij;
            o[k] = (float)(ij * ((double)gr[k] * (double)w[k] - a1 - xh * a2));
        }
    }
}

/* ln_bwd_rows_ of block c: dx for its rows (dx NULL: none), and the block's float64 partial sums of dweight
 * (part[0, c]) and dbias (part[1, c]), part (2, chunks, d); the fields in locals, as in ln_fwd_rows */
static void ln_bwd_block(void *p, i64 c) {
    const ln_pass *a = p;
    i64 d = a->d, lo, hi;
    chunk(a->rows, c, &lo, &hi);
    const float *x = a->x, *dy = a->dy, *w = a->w, *mean = a->mean_in, *rstd = a->rstd_in;
    float *dx = a->dx;
    double *pw = a->part + c * d, *pb = a->part + (a->chunks + c) * d;
    for (i64 k = 0; k < d; k++) { pw[k] = 0.0; pb[k] = 0.0; }
    for (; lo + LN_GROUP <= hi; lo += LN_GROUP) ln_bwd_group(a, lo, pw, pb);
    for (i64 r = lo; r < hi; r++) {
        const float *xr = x + r * d, *gr = dy + r * d;
        double m = (double)mean[r], inv = (double)rstd[r];
        double sg = 0.0, sgx = 0.0; /* sum of g, sum of g * xhat */
        for (i64 k = 0; k < d; k++) {
            double xh = ((double)xr[k] - m) * inv;
            double g = (double)gr[k] * (double)w[k];
            sg += g;
            sgx += g * xh;
            pw[k] += (double)gr[k] * xh;
            pb[k] += (double)gr[k];
        }
        if (dx == NULL) continue;
        sg /= (double)d;
        sgx /= (double)d;
        float *o = dx + r * d;
        for (i64 k = 0; k < d; k++) {
            double xh = ((double)xr[k] - m) * inv;
            o[k] = (float)(inv * ((double)gr[k] * (double)w[k] - sg - xh * sgx));
        }
    }
}

/* ln_bwd_ (or ln_bwd_serial_: the same blocks) then ln_param_grads_: dw, db = the partials added block by
 * block in order, rounded once */
void rnb_ln_bwd(const float *dy, const float *x, i64 rows, i64 d, const float *w, const float *mean, const float *rstd,
                float *dx, double *part, i64 chunks, float *dw, float *db, int threads) {
    ln_pass a = {.x = x, .w = w, .dy = dy, .mean_in = mean, .rstd_in = rstd, .dx = dx, .part = part, .rows = rows,
                 .d = d, .chunks = chunks};
    rnb_parallel(threads, chunks, ln_bwd_block, &a);
    for (i64 k = 0; k < d; k++) {
        double sw = 0.0, sb = 0.0;
        for (i64 c = 0; c < chunks; c++) {
            sw += part[c * d + k];
            sb += part[(chunks + c) * d + k];
        }
        dw[k] = (float)sw;
        db[k] = (float)sb;
    }
}

/* ---- embeddings (ops/embedding.py) ------------------------------------------------------------ */
typedef struct {
    const int32_t *ids;
    const float *src, *table;
    float *out, *dx;
    double *acc;
    i64 rows, n, t, d, vocab;
} embed_pass;

/* gather_rows_ / gather_par_ by blocks of the n*t rows (a copy: which block copies a row changes no byte) */
static void gather_block(void *p, i64 c) {
    const embed_pass *a = p;
    i64 lo, hi;
    chunk(a->rows, c, &lo, &hi);
    for (i64 i = lo; i < hi; i++)
        memcpy(a->out + i * a->d, a->table + (i64)a->ids[i] * a->d, (size_t)a->d * sizeof(float));
}

/* y (rows, d) = rows ids[i] of w (vocab, d); ids in [0, vocab) (checked where they enter) */
void rnb_embed_fwd(const int32_t *ids, i64 rows, const float *w, i64 d, float *y, int threads) {
    embed_pass a = {.ids = ids, .table = w, .out = y, .rows = rows, .d = d};
    rnb_parallel(threads, RNB_CHUNKS, gather_block, &a);
}

/* scatter_add_ for the rows lo..hi of block c: every row of acc sums its rows of dy in (sample, position)
 * order, as the serial loop does, so splitting the vocabulary changes no byte */
static void scatter_block(void *p, i64 c) {
    const embed_pass *a = p;
    i64 d = a->d, lo, hi;
    chunk(a->vocab, c, &lo, &hi);
    if (lo == hi) return;
    double *restrict acc = a->acc;
    memset(acc + lo * d, 0, (size_t)((hi - lo) * d) * sizeof(double));
    for (i64 i = 0; i < a->rows; i++) {
        i64 r = a->ids[i];
        if (r < lo || r >= hi) continue;
        double *restrict ar = acc + r * d;
        const float *restrict g = a->src + i * d;
        for (i64 k = 0; k < d; k++) ar[k] += (double)g[k];
    }
    float *restrict out = a->out;
    for (i64 k = lo * d; k < hi * d; k++) out[k] = (float)acc[k];
}

/* dw (vocab, d) = the float64 sums (acc (vocab, d)) of the rows of dy (rows, d) into rows ids[i], rounded once */
void rnb_embed_bwd(const int32_t *ids, i64 rows, const float *dy, i64 d, float *dw, i64 vocab, double *acc,
                   int threads) {
    embed_pass a = {.ids = ids, .src = dy, .out = dw, .acc = acc, .rows = rows, .d = d, .vocab = vocab};
    rnb_parallel(threads, RNB_CHUNKS, scatter_block, &a);
}

/* add_rows_ by blocks of the n*t rows: y[n, t] = x[n, t] + table[t] (float32) */
static void add_rows_block(void *p, i64 c) {
    const embed_pass *a = p;
    i64 d = a->d, lo, hi;
    chunk(a->rows, c, &lo, &hi);
    for (i64 i = lo; i < hi; i++) {
        const float *xr = a->src + i * d, *tr = a->table + (i % a->t) * d;
        float *yr = a->out + i * d;
        for (i64 k = 0; k < d; k++) yr[k] = xr[k] + tr[k];
    }
}

/* x, y (n, t, d); table (>= t, d): its first t rows */
void rnb_pos_fwd(const float *x, i64 n, i64 t, i64 d, const float *table, float *y, int threads) {
    embed_pass a = {.src = x, .table = table, .out = y, .rows = n * t, .n = n, .t = t, .d = d};
    rnb_parallel(threads, RNB_CHUNKS, add_rows_block, &a);
}

#define SUM_TILE 256 /* columns summed at a time in batch_block (its double accumulators, on the stack) */

/* batch_sum_ for the positions of block c: dtable[t] = the float64 sum over samples of dy[n, t], samples in
 * order, rounded once (by tiles of columns: each element's sum keeps its order); dx[n, t] = dy[n, t] */
static void batch_block(void *p, i64 c) {
    const embed_pass *a = p;
    i64 d = a->d, T = a->t, lo, hi;
    chunk(T, c, &lo, &hi);
    const float *dy = a->src;
    float *dtable = a->out, *dx = a->dx;
    double z[SUM_TILE];
    for (i64 t = lo; t < hi; t++)
        for (i64 k0 = 0; k0 < d; k0 += SUM_TILE) {
            i64 w = min64(SUM_TILE, d - k0);
            for (i64 k = 0; k < w; k++) z[k] = 0.0;
            for (i64 n = 0; n < a->n; n++) {
                const float *g = dy + (n * T + t) * d + k0;
                for (i64 k = 0; k < w; k++) z[k] += (double)g[k];
            }
            float *o = dtable + t * d + k0;
            for (i64 k = 0; k < w; k++) o[k] = (float)z[k];
        }
    if (dx == NULL || dx == dy) return;
    for (i64 n = 0; n < a->n; n++)
        memmove(dx + (n * T + lo) * d, dy + (n * T + lo) * d, (size_t)((hi - lo) * d) * sizeof(float));
}

/* pos_embedding's backward: dtable (context, d) from dy (n, t, d), its rows past t zero; dx = dy (NULL: none) */
void rnb_pos_bwd(const float *dy, i64 n, i64 t, i64 d, float *dtable, i64 context, float *dx, int threads) {
    embed_pass a = {.src = dy, .out = dtable, .dx = dx, .n = n, .t = t, .d = d};
    rnb_parallel(threads, RNB_CHUNKS, batch_block, &a);
    if (context > t) memset(dtable + t * d, 0, (size_t)((context - t) * d) * sizeof(float));
}

/* a[k] /= d over n float32 values: the per-position loss's top-1 and top-5 counts divided by the positions
 * (cpu._per_position; NumPy's float32 in-place division, the same rounding) */
void rnb_div_f32(float *a, i64 n, float d) {
    for (i64 k = 0; k < n; k++) a[k] = a[k] / d;
}

/* ---- one token (runtime/decode.py): the decode step's own kernels ------------------------------------------ */
/* embedding.add_row_at_: y = x + table[position] over one token's d features */
void rnb_add_row_at(const float *x, const float *table, const i64 *position, float *y, i64 d) {
    const float *row = table + position[0] * d;
    for (i64 k = 0; k < d; k++) y[k] = x[k] + row[k];
}

/* attention_kernels.attn_decode_: position p's key and value into the caches (h, ctx, hd), then per head the
 * float64 scores of keys 0..p, their softmax (libm exp, as numba's math.exp) and its mix of the cached values */
void rnb_attn_decode(const float *qkv, const i64 *position, float *kc, float *vc, double *scores, float *y, i64 h,
                     i64 ctx, i64 hd, double scale) {
    i64 d = h * hd, p = position[0];
    for (i64 g = 0; g < h; g++)
        for (i64 k = 0; k < hd; k++) {
            kc[(g * ctx + p) * hd + k] = qkv[d + g * hd + k];
            vc[(g * ctx + p) * hd + k] = qkv[2 * d + g * hd + k];
        }
    for (i64 g = 0; g < h; g++) {
        double *sc = scores + g * ctx, m = -INFINITY, tot = 0.0;
        const float *q = qkv + g * hd, *keys = kc + g * ctx * hd, *vals = vc + g * ctx * hd;
        for (i64 j = 0; j <= p; j++) {
            double s = 0.0;
            for (i64 k = 0; k < hd; k++) s += (double)q[k] * (double)keys[j * hd + k];
            s *= scale;
            sc[j] = s;
            if (s > m) m = s;
        }
        for (i64 j = 0; j <= p; j++) {
            double e = exp(sc[j] - m);
            sc[j] = e;
            tot += e;
        }
        for (i64 k = 0; k < hd; k++) {
            double acc = 0.0;
            for (i64 j = 0; j <= p; j++) acc += sc[j] * (double)vals[j * hd + k];
            y[g * hd + k] = (float)(acc / tot);
        }
    }
}

/* ---- the batch of token windows (cpu._token_transfer; fused.gather_token_windows) ------------------------- */
/* ids and targets of windows perm[cursor:cursor+n] (rows of t_src ids, of xitem / yitem bytes each), their first t
 * (t <= t_src: a shorter training context) into x_out and y_out (n, t); batch_status's code, 0: the cursor moved on */
i64 rnb_gather_windows(const char *xs, const char *ys, i64 rows, i64 t_src, i64 xitem, i64 yitem, const i64 *perm,
                       i64 nperm, i64 *cursor, char *x_out, char *y_out, i64 n, i64 t) {
    i64 start = cursor[0], status = batch_status(perm, nperm, start, n, rows);
    if (status) return status;
    for (i64 i = 0; i < n; i++) {
        i64 r = perm[start + i];
        memcpy(x_out + i * t * xitem, xs + r * t_src * xitem, (size_t)(t * xitem));
        memcpy(y_out + i * t * yitem, ys + r * t_src * yitem, (size_t)(t * yitem));
    }
    cursor[0] = start + n;
    return 0;
}

