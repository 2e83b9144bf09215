/* Winograd F(4x4, 3x3)'s transforms in C: the twins of kernels/winograd43.py (the same arithmetic in the
 * same types and order, built with -ffp-contract=off; tests/test_conv_native.py compares their bytes).
 * winograd_native.c's passes call them where m = 4. A tile's planes: xi = 6 i + j, c (or co) floats each.
 */
#include "native.h"

/* winograd43._gg: row k of G times (a0, a1, a2), in double */
static inline double gg(double a0, double a1, double a2, int k) {
    if (k == 0) return a0 * 0.25;
    if (k == 1) return -(a0 + a1 + a2) / 6.0;
    if (k == 2) return -(a0 - a1 + a2) / 6.0;
    if (k == 3) return (a0 + 2.0 * a1 + 4.0 * a2) / 24.0;
    if (k == 4) return (a0 - 2.0 * a1 + 4.0 * a2) / 24.0;
    return a2;
}

/* One row k of G g, then that row times G^T, for nb filters side by side (the same arithmetic per filter
 * as weights43_, vectorised across them): tap j = 3a + b of lane l at g[j][l]; plane 6k + s of lane l at
 * u[(6k + s) * plane + l]. A macro, so k is a constant inside the loop and gg's branches fold. */
#define W43_ROW(K)                                                                                             \
    _Pragma("omp simd") for (i64 l = 0; l < nb; l++) {                                                      \
        double a0 = gg(g[0][l], g[3][l], g[6][l], K), a1 = gg(g[1][l], g[4][l], g[7][l], K);                 \
        double a2 = gg(g[2][l], g[5][l], g[8][l], K);                                                         \
        float *o = u + 6 * (K) * plane + l;                                                                   \
        o[0] = (float)gg(a0, a1, a2, 0), o[plane] = (float)gg(a0, a1, a2, 1);                                 \
        o[2 * plane] = (float)gg(a0, a1, a2, 2), o[3 * plane] = (float)gg(a0, a1, a2, 3);                     \
        o[4 * plane] = (float)gg(a0, a1, a2, 4), o[5 * plane] = (float)gg(a0, a1, a2, 5);                     \
    }

static void w43_filters(const float *const g[9], i64 nb, float *u, i64 plane) {
    W43_ROW(0) W43_ROW(1) W43_ROW(2) W43_ROW(3) W43_ROW(4) W43_ROW(5)
}

/* winograd43.weights43_: u (36, U1, U2) = G g G^T from w4 (cout, 3, 3, cin); flip: the input gradient's */
void rnb_w43_weights(const float *w4, i64 cout, i64 cin, float *u, int flip, int threads) {
    each_filter(w4, cout, cin, flip, u, w43_filters, threads);
}

/* winograd43._bt_rows: t (6 rows of n) = B^T d for the rows q0..q5 (n floats each) */
static void bt_rows(const float *restrict q0, const float *restrict q1, const float *restrict q2,
                    const float *restrict q3, const float *restrict q4, const float *restrict q5, float *restrict t,
                    i64 n) {
    #pragma omp simd /* the rows never overlap (each is n long); unasked, gcc 12 leaves these loops scalar */
    for (i64 k = 0; k < n; k++) {
        float d0 = q0[k], d1 = q1[k], d2 = q2[k], d3 = q3[k], d4 = q4[k], d5 = q5[k];
        float a = d4 - 4.0f * d2, b = d3 - 4.0f * d1, e = d4 - d2, f = 2.0f * (d3 - d1);
        t[k] = 4.0f * d0 - 5.0f * d2 + d4;
        t[n + k] = a + b;
        t[2 * n + k] = a - b;
        t[3 * n + k] = e + f;
        t[4 * n + k] = e - f;
        t[5 * n + k] = 4.0f * d1 - 5.0f * d3 + d5;
    }
}

/* winograd43.in_tile6: v (36c) = B^T d B of the 6x6 patch whose rows start at p0, rs floats apart; tmp 36c */
void rnb_w43_in_tile(const float *p0, i64 rs, float *v, i64 c, float *tmp) {
    bt_rows(p0, p0 + rs, p0 + 2 * rs, p0 + 3 * rs, p0 + 4 * rs, p0 + 5 * rs, tmp, 6 * c);
    for (i64 i = 0; i < 6; i++) {
        const float *r = tmp + i * 6 * c;
        bt_rows(r, r + c, r + 2 * c, r + 3 * c, r + 4 * c, r + 5 * c, v + i * 6 * c, c);
    }
}

/* winograd43._at_rows: t (4 rows of n) = A^T x for the 6 rows of m (n floats each) */
static void at_rows(const float *restrict m, float *restrict t, i64 n) {
    #pragma omp simd
    for (i64 k = 0; k < n; k++) {
        float x0 = m[k], x1 = m[n + k], x2 = m[2 * n + k], x3 = m[3 * n + k], x4 = m[4 * n + k], x5 = m[5 * n + k];
        float s = x1 + x2, d = x1 - x2, p = x3 + x4, q = x3 - x4;
        t[k] = x0 + s + p;
        t[n + k] = d + 2.0f * q;
        t[2 * n + k] = s + 4.0f * p;
        t[3 * n + k] = d + 8.0f * q + x5;
    }
}

/* winograd43.out_tile4: y[n, oh:oh+4, ow:ow+4, :] = A^T M A, clipped at the bottom and right edges; stage 40co */
void rnb_w43_out_tile(const float *m, float *y3, i64 n, i64 oh, i64 ow, i64 co, i64 ho, i64 wo, float *stage) {
    float *tmp = stage, *clip = stage + 24 * co;
    at_rows(m, tmp, 6 * co);
    int full = oh + 3 < ho && ow + 3 < wo;
    for (i64 i = 0; i < 4; i++)
        at_rows(tmp + i * 6 * co, full ? y3 + ((n * ho + oh + i) * wo + ow) * co : clip + i * 4 * co, co);
    if (!full) copy_clipped(clip, y3, n, oh, ow, ho, wo, co, 4);
}

/* winograd43._a_rows: t (6 rows of n) = A x for the rows q0..q3 (n floats each) */
static void a_rows(const float *restrict q0, const float *restrict q1, const float *restrict q2,
                   const float *restrict q3, float *restrict t, i64 n) {
    #pragma omp simd
    for (i64 k = 0; k < n; k++) {
        float a = q0[k], b = q1[k], c = q2[k], d = q3[k];
        float s = a + c, e = b + d, s2 = a + 4.0f * c, e2 = 2.0f * b + 8.0f * d;
        t[k] = a;
        t[n + k] = s + e;
        t[2 * n + k] = s - e;
        t[3 * n + k] = s2 + e2;
        t[4 * n + k] = s2 - e2;
        t[5 * n + k] = d;
    }
}

/* winograd43.dy_tile4: dm (36co) = A dY A^T of the 4x4 output-gradient tile whose rows start at r0, rs floats
 * apart (4co each); tmp 24co */
void rnb_w43_dy_tile(const float *r0, i64 rs, float *dm, i64 co, float *tmp) {
    a_rows(r0, r0 + rs, r0 + 2 * rs, r0 + 3 * rs, tmp, 4 * co);
    for (i64 i = 0; i < 6; i++) {
        const float *r = tmp + i * 4 * co;
        a_rows(r, r + co, r + 2 * co, r + 3 * co, dm + i * 6 * co, co);
    }
}

/* winograd43._gt6: row r of G^T times (p0, ..., p5), in double */
static inline double gt6(double p0, double a, double b, double c, double d, double p5, int r) {
    if (r == 0) return p0 * 0.25 - (a + b) / 6.0 + (c + d) / 24.0;
    if (r == 1) return (b - a) / 6.0 + (c - d) / 12.0;
    return ((c + d) - (a + b)) / 6.0 + p5;
}

/* G^T D G for nb lanes side by side (lane l: D's plane xi at e[xi * pl + l]), as dw_from_total43 computes it per
 * (ci, co), in two steps of small loops (one loop over all 36 planes took the compiler 0.4 s): column S of D gives
 * t[r][S] = row r of G^T times it for r = 0, 1, 2; then row R of t gives out[3R + s] = (t[R] G)[s]. Macros, so r,
 * s and S are constants inside the loops. */
#define W43_DW_COL(S)                                                                                          \
    _Pragma("omp simd") for (i64 l = 0; l < nb; l++) {                                                      \
        const float *q = e + (S) * pl + l;                                                                    \
        double p0 = q[0], p1 = q[6 * pl], p2 = q[12 * pl], p3 = q[18 * pl], p4 = q[24 * pl], p5 = q[30 * pl];  \
        t[0][S][l] = gt6(p0, p1, p2, p3, p4, p5, 0);                                                           \
        t[1][S][l] = gt6(p0, p1, p2, p3, p4, p5, 1);                                                           \
        t[2][S][l] = gt6(p0, p1, p2, p3, p4, p5, 2);                                                           \
    }
#define W43_DW_ROW(R)                                                                                          \
    _Pragma("omp simd") for (i64 l = 0; l < nb; l++) {                                                      \
        double t0 = t[R][0][l], t1 = t[R][1][l], t2 = t[R][2][l], t3 = t[R][3][l], t4 = t[R][4][l];            \
        double t5 = t[R][5][l];                                                                               \
        out[3 * (R)][l] = (float)gt6(t0, t1, t2, t3, t4, t5, 0);                                              \
        out[3 * (R) + 1][l] = (float)gt6(t0, t1, t2, t3, t4, t5, 1);                                          \
        out[3 * (R) + 2][l] = (float)gt6(t0, t1, t2, t3, t4, t5, 2);                                          \
    }

/* winograd43.dw_from_total43 for filters ci0..ci1: dw4 (co, 3, 3, c) = G^T D G for D = d[:, ci, co] (36
 * planes of c co), FILTER_LANES output channels at a time, then scattered into dw4 */
void rnb_w43_dw_total(const float *d, float *dw4, i64 c, i64 co, i64 ci0, i64 ci1) {
    i64 pl = c * co;
    float out[9][FILTER_LANES];
    double t[3][6][FILTER_LANES];
    for (i64 ci = ci0; ci < ci1; ci++)
        for (i64 o0 = 0; o0 < co; o0 += FILTER_LANES) {
            i64 nb = min64(FILTER_LANES, co - o0);
            const float *e = d + ci * co + o0;
            W43_DW_COL(0) W43_DW_COL(1) W43_DW_COL(2) W43_DW_COL(3) W43_DW_COL(4) W43_DW_COL(5)
            W43_DW_ROW(0) W43_DW_ROW(1) W43_DW_ROW(2)
            for (i64 l = 0; l < nb; l++)
                for (int k = 0; k < 9; k++) dw4[((o0 + l) * 9 + k) * c + ci] = out[k][l];
        }
}
