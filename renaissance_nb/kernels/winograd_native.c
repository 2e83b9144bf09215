/* The convolutions' threaded passes that call sgemm, in C: Winograd F(2x2, 3x3) and F(4x4, 3x3) (its
 * transforms: winograd43_native.c) forward (and input gradient)
 * and weight gradient (winograd.fwd_, dw_), and the im2col convolutions by tiles of images (conv_tiled.
 * conv_fwd_tiles_, conv_bwd_tiles_). The twins of those numba kernels (kernels/conv_native.py binds them,
 * tests/test_conv_native.py compares their bytes): the same sgemm calls (the BLAS's address, the same
 * shapes, strides and buffers) and the same transforms in the same types and order, built with
 * -ffp-contract=off. Thread t of the numba kernel's prange is block t here (rnb_parallel, pool_native.c):
 * its share of the batch, its own buffer and dW partial, the partials added in thread order after.
 */
#include "native.h"

#define PAD 16 /* winograd.PAD */

/* winograd43_native.c: F(4x4, 3x3)'s transforms */
void rnb_w43_weights(const float *w4, i64 cout, i64 cin, float *u, int flip, int threads);
void rnb_w43_in_tile(const float *p0, i64 rs, float *v, i64 c, float *tmp);
void rnb_w43_out_tile(const float *m, float *y3, i64 n, i64 oh, i64 ow, i64 co, i64 ho, i64 wo, float *stage);
void rnb_w43_dy_tile(const float *r0, i64 rs, float *dm, i64 co, float *tmp);
void rnb_w43_dw_total(const float *d, float *dw4, i64 c, i64 co, i64 ci0, i64 ci1);

void rnb_bias_act(float *y, i64 n, i64 m, i64 ldy, const float *b, i64 nb, i64 act, double slope, int threads);
void rnb_im2col_images(const float *x3, i64 h, i64 w, i64 c, float *cols, i64 k, i64 s, i64 p, i64 ho, i64 wo,
                       i64 n0, i64 n1);
void rnb_col2im_images(const float *dcols, float *dx3, i64 h, i64 w, i64 c, i64 k, i64 s, i64 p, i64 ho, i64 wo,
                       i64 n0, i64 n1);

/* blas.sgemm_at: row-major sgemm through the BLAS's address, c = op(a) op(b) (add: c += ...) */
typedef void (*sgemm64_t)(int, int, int, i64, i64, i64, float, const float *, i64, const float *, i64, float, float *, i64);
typedef void (*sgemm32_t)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);
enum { NO_TRANS = 111, TRANS = 112 };

static void sgemm_at(void *f, int wide, int ta, int tb, i64 m, i64 n, i64 k, const float *a, i64 lda, const float *b,
                     i64 ldb, float *c, i64 ldc, int add) {
    float beta = add ? 1.0f : 0.0f;
    if (wide) ((sgemm64_t)f)(101, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
    else ((sgemm32_t)f)(101, ta, tb, (int)m, (int)n, (int)k, 1.0f, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* conv_tiled.add_parts_: out = out + parts[0] + parts[1] + ... (float32, in that order) */
static void add_parts(const float *restrict parts, i64 nparts, float *restrict out, i64 size) {
    for (i64 j = 0; j < size; j++) {
        float acc = out[j];
        for (i64 t = 0; t < nparts; t++) acc += parts[t * size + j];
        out[j] = acc;
    }
}

/* ---- im2col convolutions by tiles (conv_tiled.py) ----------------------------------------------- */
typedef struct { /* a tiled convolution: thread t's share of images, tile images at a time, in its buffer */
    void *f;
    int wide;
    const float *x3, *w2, *dy2, *b;
    float *y2, *dw2, *parts, *scratch, *dscratch, *dx3;
    i64 n, h, w, c, cout, threads, k, s, p, ho, wo, tile, nb, act;
} tiles;

static void fwd_tiles_share(void *v, i64 t) {
    const tiles *a = v;
    i64 per = a->ho * a->wo, kk = a->k * a->k * a->c, cout = a->cout;
    float *buf = a->scratch + t * a->tile * per * kk;
    for (i64 b0 = cut(a->n, a->threads, t), n1 = cut(a->n, a->threads, t + 1); b0 < n1;) {
        i64 b1 = min64(n1, b0 + a->tile), r0 = b0 * per, rows = (b1 - b0) * per;
        rnb_im2col_images(a->x3, a->h, a->w, a->c, buf, a->k, a->s, a->p, a->ho, a->wo, b0, b1);
        sgemm_at(a->f, a->wide, NO_TRANS, TRANS, rows, cout, kk, buf, kk, a->w2, kk, a->y2 + r0 * cout, cout, 0);
        if (a->act != 0 || a->nb > 0) rnb_bias_act(a->y2 + r0 * cout, rows, cout, cout, a->b, a->nb, a->act, 0.0, 1);
        b0 = b1;
    }
}

/* y2 (n*ho*wo, cout) = act(im2col(x3) w2^T + b); scratch: threads buffers of tile*ho*wo rows of kk */
void rnb_conv_fwd_tiles(void *f, int wide, const float *x3, i64 n, i64 h, i64 w, i64 c, const float *w2, i64 cout,
                        float *y2, float *scratch, i64 threads, i64 k, i64 s, i64 p, i64 ho, i64 wo, i64 tile,
                        const float *b, i64 nb, i64 act) {
    tiles a = {.f = f, .wide = wide, .x3 = x3, .w2 = w2, .b = b, .y2 = y2, .scratch = scratch, .n = n, .h = h, .w = w,
               .c = c, .cout = cout, .threads = threads, .k = k, .s = s, .p = p, .ho = ho, .wo = wo, .tile = tile,
               .nb = nb, .act = act};
    rnb_parallel((int)threads, threads, fwd_tiles_share, &a);
}

static void bwd_tiles_share(void *v, i64 t) {
    const tiles *a = v;
    i64 per = a->ho * a->wo, kk = a->k * a->k * a->c, cout = a->cout;
    float *buf = a->scratch + t * a->tile * per * kk;
    float *dbuf = a->dx3 ? a->dscratch + t * a->tile * per * kk : buf;
    float *part = t == 0 ? a->dw2 : a->parts + (t - 1) * cout * kk;
    int first = 1;
    for (i64 b0 = cut(a->n, a->threads, t), n1 = cut(a->n, a->threads, t + 1); b0 < n1;) {
        i64 b1 = min64(n1, b0 + a->tile), r0 = b0 * per, rows = (b1 - b0) * per;
        rnb_im2col_images(a->x3, a->h, a->w, a->c, buf, a->k, a->s, a->p, a->ho, a->wo, b0, b1);
        const float *dyt = a->dy2 + r0 * cout;
        sgemm_at(a->f, a->wide, TRANS, NO_TRANS, cout, kk, rows, dyt, cout, buf, kk, part, kk, !first);
        if (a->dx3) {
            sgemm_at(a->f, a->wide, NO_TRANS, NO_TRANS, rows, kk, cout, dyt, cout, a->w2, kk, dbuf, kk, 0);
            rnb_col2im_images(dbuf, a->dx3, a->h, a->w, a->c, a->k, a->s, a->p, a->ho, a->wo, b0, b1);
        }
        first = 0;
        b0 = b1;
    }
    if (first) memset(part, 0, (size_t)(cout * kk) * sizeof(float));
}

/* dW (thread 0 into dw2, thread t > 0 into parts[t - 1], added in order) = sum of dy_tile^T cols_tile; with dx3
 * (need_dx) also dcols_tile = dy_tile w2, col2im'd into dx3 */
void rnb_conv_bwd_tiles(void *f, int wide, const float *x3, i64 n, i64 h, i64 w, i64 c, const float *dy2,
                        const float *w2, i64 cout, float *dw2, float *parts, float *scratch, float *dscratch,
                        float *dx3, i64 threads, i64 k, i64 s, i64 p, i64 ho, i64 wo, i64 tile) {
    tiles a = {.f = f, .wide = wide, .x3 = x3, .w2 = w2, .dy2 = dy2, .dw2 = dw2, .parts = parts, .scratch = scratch,
               .dscratch = dscratch, .dx3 = dx3, .n = n, .h = h, .w = w, .c = c, .cout = cout, .threads = threads,
               .k = k, .s = s, .p = p, .ho = ho, .wo = wo, .tile = tile};
    rnb_parallel((int)threads, threads, bwd_tiles_share, &a);
    add_parts(parts, threads - 1, dw2, cout * k * k * c);
}

/* ---- Winograd F(2x2, 3x3) (winograd.py) ------------------------------------------------------- */
/* winograd.weights_: u (16, U1, U2) = G g G^T from w4 (cout, 3, 3, cin) for nb filters side by side (each_filter),
 * in double, rounded once: rows 0 and 12 of G g are g's rows 0 and 2, rows 4 and 8 (g0 + g1 + g2) / 2 and
 * (g0 - g1 + g2) / 2; each row (a0, a1, a2) then gives a0, (a0 + a1 + a2) / 2, (a0 - a1 + a2) / 2, a2 */
#define W22_ROW(R, A0, A1, A2)                                                                                 \
    {                                                                                                          \
        double a0 = (A0), a1 = (A1), a2 = (A2);                                                                \
        float *o = u + (R) * plane + l;                                                                        \
        o[0] = (float)a0, o[plane] = (float)((a0 + a1 + a2) * 0.5);                                            \
        o[2 * plane] = (float)((a0 - a1 + a2) * 0.5), o[3 * plane] = (float)a2;                                \
    }

static void w22_filters(const float *const g[9], i64 nb, float *u, i64 plane) {
    #pragma omp simd
    for (i64 l = 0; l < nb; l++) {
        double g00 = g[0][l], g01 = g[1][l], g02 = g[2][l], g10 = g[3][l], g11 = g[4][l], g12 = g[5][l];
        double g20 = g[6][l], g21 = g[7][l], g22 = g[8][l];
        W22_ROW(0, g00, g01, g02)
        W22_ROW(4, (g00 + g10 + g20) * 0.5, (g01 + g11 + g21) * 0.5, (g02 + g12 + g22) * 0.5)
        W22_ROW(8, (g00 - g10 + g20) * 0.5, (g01 - g11 + g21) * 0.5, (g02 - g12 + g22) * 0.5)
        W22_ROW(12, g20, g21, g22)
    }
}

void rnb_winograd_weights(const float *w4, i64 cout, i64 cin, float *u, int flip, int threads) {
    each_filter(w4, cout, cin, flip, u, w22_filters, threads);
}

/* winograd._in_row and _in_tile: v (16c) = B^T d B of the 4x4 patch with rows p0..p3 (4c each) */
static void in_row(const float *restrict pa, const float *restrict pb, float sign, float *restrict v, i64 c) {
    for (i64 k = 0; k < c; k++) {
        float e0 = pa[k] + sign * pb[k], e1 = pa[c + k] + sign * pb[c + k];
        float e2 = pa[2 * c + k] + sign * pb[2 * c + k], e3 = pa[3 * c + k] + sign * pb[3 * c + k];
        v[k] = e0 - e2;
        v[c + k] = e1 + e2;
        v[2 * c + k] = e2 - e1;
        v[3 * c + k] = e1 - e3;
    }
}

static void in_tile(const float *p0, const float *p1, const float *p2, const float *p3, float *v, i64 c) {
    in_row(p0, p2, -1.0f, v, c);
    in_row(p1, p2, 1.0f, v + 4 * c, c);
    in_row(p2, p1, -1.0f, v + 8 * c, c);
    in_row(p1, p3, -1.0f, v + 12 * c, c);
}

typedef struct { /* a Winograd pass's geometry: input h x w of c channels, output ho x wo of co, m x m tiles */
    const float *x3;
    i64 h, w, c, co, ho, wo, th, tw, m;
} wgeom;

/* winograd._stage: stage (t, tc) = the t x t patch (t = m + 2) of image n at rows r0.., pixels c0.. (zeros
 * outside) */
static void stage_patch(const wgeom *g, i64 n, i64 r0, i64 c0, float *stage) {
    i64 c = g->c, t = g->m + 2;
    for (i64 a = 0; a < t; a++)
        for (i64 b = 0; b < t; b++) {
            float *seg = stage + a * t * c + b * c;
            i64 r = r0 + a, col = c0 + b;
            if (r < 0 || r >= g->h || col < 0 || col >= g->w) memset(seg, 0, (size_t)c * sizeof(float));
            else memcpy(seg, g->x3 + ((n * g->h + r) * g->w + col) * c, (size_t)c * sizeof(float));
        }
}

/* winograd._inputs: V of the tiles of tile rows u0..u1, one row of v (stride vt) per tile; returns how many */
static i64 inputs(const wgeom *g, float *v, i64 vt, float *stage, i64 u0, i64 u1) {
    i64 q = 0, c = g->c, rw = g->w * c, m = g->m, t = m + 2;
    float *tmp = stage + t * t * c;
    for (i64 un = u0; un < u1; un++) {
        i64 n = un / g->th, r0 = m * (un % g->th) - 1;
        int inner = r0 >= 0 && r0 + t <= g->h;
        for (i64 tj = 0; tj < g->tw; tj++, q++) {
            i64 c0 = m * tj - 1;
            int staged = !(inner && c0 >= 0 && c0 + t <= g->w);
            const float *p0 = staged ? stage : g->x3 + (n * g->h + r0) * rw + c0 * c;
            i64 rs = staged ? t * c : rw;
            if (staged) stage_patch(g, n, r0, c0, stage);
            if (m == 2) in_tile(p0, p0 + rs, p0 + 2 * rs, p0 + 3 * rs, v + q * vt, c);
            else rnb_w43_in_tile(p0, rs, v + q * vt, c, tmp);
        }
    }
    return q;
}

/* winograd._out_row: one output row of A^T M A (2co) */
static void out_row(const float *restrict m, i64 ra, i64 rb, i64 rc, float sign, float *restrict y, i64 co) {
    const float *a = m + ra * 4 * co, *b = m + rb * 4 * co, *c = m + rc * 4 * co;
    for (i64 k = 0; k < co; k++) {
        float g0 = a[k] + sign * b[k] + sign * c[k];
        float g1 = a[co + k] + sign * b[co + k] + sign * c[co + k];
        float g2 = a[2 * co + k] + sign * b[2 * co + k] + sign * c[2 * co + k];
        float g3 = a[3 * co + k] + sign * b[3 * co + k] + sign * c[3 * co + k];
        y[k] = g0 + g1 + g2;
        y[co + k] = g1 - g2 - g3;
    }
}

/* winograd._out_tile: y[n, oh:oh+2, ow:ow+2, :] = A^T M A, clipped at the bottom and right edges */
static void out_tile(const float *m, float *y3, i64 n, i64 oh, i64 ow, i64 co, i64 ho, i64 wo, float *stage) {
    float *row = y3 + ((n * ho + oh) * wo + ow) * co;
    if (oh + 1 < ho && ow + 1 < wo) {
        out_row(m, 0, 1, 2, 1.0f, row, co);
        out_row(m, 1, 2, 3, -1.0f, row + wo * co, co);
        return;
    }
    out_row(m, 0, 1, 2, 1.0f, stage, co);
    out_row(m, 1, 2, 3, -1.0f, stage + 2 * co, co);
    copy_clipped(stage, y3, n, oh, ow, ho, wo, co, 2);
}

/* winograd.part_at: where a thread's dU partial starts in its buffer */
static i64 part_at(i64 cap, i64 c, i64 co, i64 m) {
    i64 p = (m + 2) * (m + 2);
    return cap * (p * (c + co) + 2 * PAD) + (m == 2 ? 16 * (c + co) : 72 * c + 40 * co);
}

/* winograd._fwd_share: tile rows u0..u1, `rows` at a time, in one thread's buffer */
static void fwd_share(void *f, int wide, const wgeom *g, const float *u, float *y3, const float *b, i64 nb, i64 act,
                      float *buf, i64 rows, i64 u0, i64 u1) {
    i64 c = g->c, co = g->co, cap = rows * g->tw, tm = g->m, p = (tm + 2) * (tm + 2), vt = p * c + PAD, mt = p * co + PAD;
    float *v = buf, *m = buf + cap * vt, *stage = buf + cap * (vt + mt);
    while (u0 < u1) {
        i64 ue = min64(u1, u0 + rows);
        i64 q = inputs(g, v, vt, stage, u0, ue);
        for (i64 xi = 0; xi < p; xi++)
            sgemm_at(f, wide, NO_TRANS, NO_TRANS, q, co, c, v + xi * c, vt, u + xi * c * co, co, m + xi * co, mt, 0);
        q = 0;
        for (i64 un = u0; un < ue; un++) {
            i64 n = un / g->th, oh = tm * (un % g->th);
            for (i64 tj = 0; tj < g->tw; tj++, q++) {
                if (tm == 2) out_tile(m + q * mt, y3, n, oh, 2 * tj, co, g->ho, g->wo, stage);
                else rnb_w43_out_tile(m + q * mt, y3, n, oh, 4 * tj, co, g->ho, g->wo, stage);
            }
        }
        if (act != 0 || nb > 0) { /* the chunk's output rows are one run of y's rows */
            i64 first = (u0 / g->th * g->ho + tm * (u0 % g->th)) * g->wo;
            i64 last = ((ue - 1) / g->th * g->ho + min64(g->ho, tm * ((ue - 1) % g->th) + tm)) * g->wo;
            rnb_bias_act(y3 + first * co, last - first, co, co, b, nb, act, 0.0, 1);
        }
        u0 = ue;
    }
}

typedef struct { /* a Winograd pass: thread t's share of the tile rows in bufs[t] */
    void *f;
    int wide;
    const wgeom *g;
    const float *u, *b, *dy3;
    float *y3, *bufs;
    i64 nb, act, rows, units, threads, per_thread;
} wpass;

static void fwd_block(void *v, i64 t) {
    const wpass *a = v;
    fwd_share(a->f, a->wide, a->g, a->u, a->y3, a->b, a->nb, a->act, a->bufs + t * a->per_thread, a->rows,
              cut(a->units, a->threads, t), cut(a->units, a->threads, t + 1));
}

/* winograd.fwd_ after weights_: y = act(conv3x3(x) + b) (x (n, h, w, c), y (n, h, w, co)); bufs: threads
 * buffers of per_thread floats; u (16, c, co) is written from w4 first (flip: the input gradient) */
void rnb_winograd_fwd(void *f, int wide, const float *w4, int flip, float *u, const float *x3, i64 n, i64 h, i64 w,
                      i64 c, float *y3, i64 co, const float *b, i64 nb, i64 act, float *bufs, i64 threads,
                      i64 per_thread, i64 rows, i64 m) {
    i64 wout = flip ? c : co, win = flip ? co : c; /* w4 is (wout, 3, 3, win) */
    (m == 2 ? rnb_winograd_weights : rnb_w43_weights)(w4, wout, win, u, flip, (int)threads);
    wgeom g = {x3, h, w, c, co, h, w, (h + m - 1) / m, (w + m - 1) / m, m};
    wpass a = {.f = f, .wide = wide, .g = &g, .u = u, .b = b, .y3 = y3, .bufs = bufs, .nb = nb, .act = act,
               .rows = rows, .units = n * g.th, .threads = threads, .per_thread = per_thread};
    rnb_parallel((int)threads, threads, fwd_block, &a);
}

/* winograd._dy_tile: dm (16co) = A dY A^T of the 2x2 output-gradient tile with rows r0, r1 (2co each) */
static void dy_tile(const float *restrict r0, const float *restrict r1, float *restrict dm, i64 co) {
    for (i64 k = 0; k < co; k++) {
        float a = r0[k], b = r0[co + k], c = r1[k], d = r1[co + k];
        float p1 = a + c, q1 = b + d;
        dm[k] = a;
        dm[co + k] = a + b;
        dm[2 * co + k] = a - b;
        dm[3 * co + k] = -b;
        dm[4 * co + k] = p1;
        dm[5 * co + k] = p1 + q1;
        dm[6 * co + k] = p1 - q1;
        dm[7 * co + k] = -q1;
    }
    for (i64 k = 0; k < co; k++) {
        float a = r0[k], b = r0[co + k], c = r1[k], d = r1[co + k];
        float p2 = a - c, q2 = b - d;
        dm[8 * co + k] = p2;
        dm[9 * co + k] = p2 + q2;
        dm[10 * co + k] = p2 - q2;
        dm[11 * co + k] = -q2;
        dm[12 * co + k] = -c;
        dm[13 * co + k] = -c - d;
        dm[14 * co + k] = d - c;
        dm[15 * co + k] = d;
    }
}

/* winograd._dy_tiles: A dY A^T of the output-gradient tiles of tile rows u0..ue, one row of dm (stride mt) each */
static i64 dy_tiles(const wgeom *g, const float *dy3, float *dm, i64 mt, float *stage, i64 u0, i64 ue) {
    i64 co = g->co, m = g->m, q = 0;
    float *tmp = stage + m * m * co;
    for (i64 un = u0; un < ue; un++) {
        i64 n = un / g->th, oh = m * (un % g->th);
        for (i64 tj = 0; tj < g->tw; tj++, q++) {
            i64 ow = m * tj, rs = g->wo * co;
            const float *row = dy3 + ((n * g->ho + oh) * g->wo + ow) * co;
            if (!(oh + m - 1 < g->ho && ow + m - 1 < g->wo)) {
                for (i64 a = 0; a < m; a++) /* winograd._stage_dy */
                    for (i64 b = 0; b < m; b++) {
                        float *seg = stage + a * m * co + b * co;
                        if (oh + a < g->ho && ow + b < g->wo)
                            memcpy(seg, dy3 + ((n * g->ho + oh + a) * g->wo + ow + b) * co, (size_t)co * sizeof(float));
                        else memset(seg, 0, (size_t)co * sizeof(float));
                    }
                row = stage;
                rs = m * co;
            }
            if (m == 2) dy_tile(row, row + rs, dm + q * mt, co);
            else rnb_w43_dy_tile(row, rs, dm + q * mt, co, tmp);
        }
    }
    return q;
}

/* winograd._dw_share: V^T (A dY A^T) over tile rows u0..u1 added into this thread's dU partial */
static void dw_share(void *f, int wide, const wgeom *g, const float *dy3, float *buf, i64 rows, i64 u0, i64 u1) {
    i64 c = g->c, co = g->co, cap = rows * g->tw, p = (g->m + 2) * (g->m + 2), vt = p * c + PAD, mt = p * co + PAD;
    float *v = buf, *m = buf + cap * vt, *stage = buf + cap * (vt + mt), *part = buf + part_at(cap, c, co, g->m);
    if (u0 >= u1) memset(part, 0, (size_t)(p * c * co) * sizeof(float));
    int first = 1;
    while (u0 < u1) {
        i64 ue = min64(u1, u0 + rows);
        inputs(g, v, vt, stage, u0, ue); /* the stage is free again before the dy tiles use it */
        i64 q = dy_tiles(g, dy3, m, mt, stage, u0, ue);
        for (i64 xi = 0; xi < p; xi++)
            sgemm_at(f, wide, TRANS, NO_TRANS, c, co, q, v + xi * c, vt, m + xi * co, mt, part + xi * c * co, co, !first);
        first = 0;
        u0 = ue;
    }
}

/* winograd._gt: row r of G^T (p0, p1, p2, p3), in double */
static inline double gt(double p0, double p1, double p2, double p3, int r) {
    if (r == 0) return p0 + (p1 + p2) * 0.5;
    if (r == 1) return (p1 - p2) * 0.5;
    return (p1 + p2) * 0.5 + p3;
}

static void dw_block(void *v, i64 t) {
    const wpass *a = v;
    dw_share(a->f, a->wide, a->g, a->dy3, a->bufs + t * a->per_thread, a->rows, cut(a->units, a->threads, t),
             cut(a->units, a->threads, t + 1));
}

/* winograd._dw_from_total for filters ci0..ci1: dw4 (co, 3, 3, c) = G^T D G, D the summed dU */
static void w22_dw_total(const float *d, float *dw4, i64 c, i64 co, i64 ci0, i64 ci1) {
    for (i64 ci = ci0; ci < ci1; ci++)
        for (i64 o = 0; o < co; o++) {
            i64 j = ci * co + o;
            for (int r = 0; r < 3; r++) {
                double t0 = gt(d[j], d[4 * c * co + j], d[8 * c * co + j], d[12 * c * co + j], r);
                double t1 = gt(d[c * co + j], d[5 * c * co + j], d[9 * c * co + j], d[13 * c * co + j], r);
                double t2 = gt(d[2 * c * co + j], d[6 * c * co + j], d[10 * c * co + j], d[14 * c * co + j], r);
                double t3 = gt(d[3 * c * co + j], d[7 * c * co + j], d[11 * c * co + j], d[15 * c * co + j], r);
                for (int s = 0; s < 3; s++) dw4[((o * 3 + r) * 3 + s) * c + ci] = (float)gt(t0, t1, t2, t3, s);
            }
        }
}

typedef struct { float *bufs, *dw4; i64 threads, per_thread, at, c, co, m; } dw_total_job;

/* block b of dw_'s end: for its input channels, the threads' dU partials added in thread order into the
 * first (add_parts_), then dW = G^T dU G; each weight's arithmetic is fixed, whichever thread runs it */
static void dw_total_block(void *v, i64 b) {
    const dw_total_job *a = v;
    i64 c = a->c, co = a->co, p = (a->m + 2) * (a->m + 2), ci0 = cut(c, RNB_CHUNKS, b), ci1 = cut(c, RNB_CHUNKS, b + 1);
    float *d = a->bufs + a->at;
    for (i64 xi = 0; xi < p; xi++)
        for (i64 j = (xi * c + ci0) * co; j < (xi * c + ci1) * co; j++) {
            float acc = d[j];
            for (i64 t = 1; t < a->threads; t++) acc += a->bufs[t * a->per_thread + a->at + j];
            d[j] = acc;
        }
    if (a->m == 4) rnb_w43_dw_total(d, a->dw4, c, co, ci0, ci1);
    else w22_dw_total(d, a->dw4, c, co, ci0, ci1);
}

/* winograd.dw_: dw4 (co, 3, 3, c) = G^T dU G, dU the threads' partials (at part_at in each buffer) summed in order */
void rnb_winograd_dw(void *f, int wide, const float *x3, i64 n, i64 h, i64 w, i64 c, const float *dy3, i64 co,
                     float *dw4, float *bufs, i64 threads, i64 per_thread, i64 rows, i64 m) {
    wgeom g = {x3, h, w, c, co, h, w, (h + m - 1) / m, (w + m - 1) / m, m};
    wpass a = {.f = f, .wide = wide, .g = &g, .dy3 = dy3, .bufs = bufs, .rows = rows, .units = n * g.th,
               .threads = threads, .per_thread = per_thread};
    rnb_parallel((int)threads, threads, dw_block, &a);
    dw_total_job t = {bufs, dw4, threads, per_thread, part_at(rows * g.tw, c, co, m), c, co, m};
    rnb_parallel((int)threads, RNB_CHUNKS, dw_total_block, &t);
}
