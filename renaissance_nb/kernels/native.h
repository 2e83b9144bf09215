/* What every C source of the CPU kernels shares (native_build.py compiles them into the library's parts):
 * the chunking of a range into RNB_CHUNKS blocks and the fork-safe thread count. */
#ifndef RNB_NATIVE_H
#define RNB_NATIVE_H
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define RNB_CHUNKS 8 /* operands.PAR_CHUNKS */
#define RNB_TINY32 1.17549435e-38f /* np.finfo(np.float32).tiny: optimizer state below it is stored as 0 */

typedef int64_t i64;

static inline i64 min64(i64 a, i64 b) { return a < b ? a : b; }

/* fused.cut: start of part t of size items cut into parts */
static inline i64 cut(i64 size, i64 parts, i64 t) { return size * t / parts; }

/* fused.chunk: chunk c of range(n) as [lo, hi) */
static inline void chunk(i64 n, i64 c, i64 *lo, i64 *hi) {
    i64 ch = (n + RNB_CHUNKS - 1) / RNB_CHUNKS;
    *lo = min64(n, c * ch);
    *hi = min64(n, *lo + ch);
}

/* fused.batch_status: 0 when perm[start:start+n] lies in the order and names rows < rows; 1 the cursor runs past
 * the order, 2 an entry is not a row. Checked before anything is copied (the batch gathers) */
static inline i64 batch_status(const i64 *perm, i64 nperm, i64 start, i64 n, i64 rows) {
    if (start < 0 || start + n > nperm) return 1;
    for (i64 i = 0; i < n; i++) {
        i64 r = perm[start + i];
        if (r < 0 || r >= rows) return 2;
    }
    return 0;
}

/* winograd43.copy_clipped: the part inside the ho x wo map of an m x m output tile at (oh, ow) of image n
 * (``tile``: its m rows of m pixels of co channels) into y3 (n, ho, wo, co): both Winograd tiles' border step */
static inline void copy_clipped(const float *tile, float *y3, i64 n, i64 oh, i64 ow, i64 ho, i64 wo, i64 co, i64 m) {
    for (i64 a = 0; a < m; a++)
        for (i64 b = 0; b < m; b++)
            if (oh + a < ho && ow + b < wo)
                memcpy(y3 + ((n * ho + oh + a) * wo + ow + b) * co, tile + (m * a + b) * co, (size_t)co * sizeof(float));
}

/* pool_native.c: fn(ctx, b) for every block b < blocks, on up to `threads` threads (the caller's among
 * them), each block by whichever thread claims it first: a block's work must not depend on its thread */
typedef void (*rnb_block_fn)(void *ctx, i64 block);
#ifdef RNB_PART
/* a part of the library built apart from the core (native_build.py, PARTS): it runs on the core's pool and
 * reads its fork flag through these, which part.c's rnb_part_link sets when the part is loaded */
extern void (*rnb_parallel_in_core)(int threads, i64 blocks, rnb_block_fn fn, void *ctx);
extern volatile int *rnb_forked_in_core;
#define rnb_parallel(...) rnb_parallel_in_core(__VA_ARGS__)
#define rnb_forked (*rnb_forked_in_core)
#else
void rnb_parallel(int threads, i64 blocks, rnb_block_fn fn, void *ctx);
extern volatile int rnb_forked; /* set in a forked child (native.c) */
#endif

/* one thread after a fork (native.c says why) */
static inline int team(int threads) { return rnb_forked ? 1 : threads; } /* native_build.py checks the ABI: a stale library is rebuilt, never called */

/* both Winograd filter transforms' walk: fn(g, nb, u, plane) for nb filters side by side (lanes), tap
 * j = 3a + b of lane l at g[j][l], lane l's transform at u[xi * plane + l] in each (Cin, Cout) plane of u
 * (or (Cout, Cin) with flip: the input gradient's filters, turned 180 degrees). With flip the lanes run
 * over ci, whose taps and places are runs in w4 and u; else over co, their taps gathered FILTER_LANES at a
 * time. The filters are cut into RNB_CHUNKS blocks on the pool: a filter's arithmetic never depends on
 * its lane or block, so the bytes are the one-at-a-time walk's. */
#define FILTER_LANES 64
typedef void (*filter_lanes)(const float *const g[9], i64 nb, float *u, i64 plane);
typedef struct { const float *w4; i64 cout, cin; float *u; int flip; filter_lanes fn; } filter_walk;

static inline void filters_block(void *v, i64 b) {
    const filter_walk *a = v;
    i64 cout = a->cout, cin = a->cin, plane = cout * cin, outer = a->flip ? cout : cin;
    float taps[9][FILTER_LANES];
    const float *g[9];
    for (i64 o = cut(outer, RNB_CHUNKS, b); o < cut(outer, RNB_CHUNKS, b + 1); o++) {
        if (a->flip) {
            for (int j = 0; j < 9; j++) g[j] = a->w4 + ((o * 3 + 2 - j / 3) * 3 + 2 - j % 3) * cin;
            a->fn(g, cin, a->u + o * cin, plane);
            continue;
        }
        for (i64 c0 = 0; c0 < cout; c0 += FILTER_LANES) {
            i64 nb = min64(FILTER_LANES, cout - c0);
            for (i64 l = 0; l < nb; l++)
                for (int j = 0; j < 9; j++) taps[j][l] = a->w4[((c0 + l) * 9 + j) * cin + o];
            for (int j = 0; j < 9; j++) g[j] = taps[j];
            a->fn(g, nb, a->u + o * cout + c0, plane);
        }
    }
}

static inline void each_filter(const float *w4, i64 cout, i64 cin, int flip, float *u, filter_lanes fn, int threads) {
    filter_walk a = {w4, cout, cin, u, flip, fn};
    rnb_parallel(threads, RNB_CHUNKS, filters_block, &a);
}

/* philox.philox_block: Philox4x32-10 of the counter (c0..c3) under the key (k0, k1), words < 2**32 */
static inline void philox_block(uint64_t c0, uint64_t c1, uint64_t c2, uint64_t c3, uint64_t k0, uint64_t k1, uint64_t out[4]) {
    for (int r = 0; r < 10; r++) {
        if (r) { k0 = (k0 + 0x9E3779B9ull) & 0xFFFFFFFFull; k1 = (k1 + 0xBB67AE85ull) & 0xFFFFFFFFull; }
        uint64_t p0 = 0xD2511F53ull * c0, p1 = 0xCD9E8D57ull * c2;
        uint64_t n0 = (p1 >> 32) ^ c1 ^ k0, n1 = p1 & 0xFFFFFFFFull, n2 = (p0 >> 32) ^ c3 ^ k1, n3 = p0 & 0xFFFFFFFFull;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* exp_math.neg_exp (its numba twin): exp(a) for a <= 0, Cody-Waite reduction by ln 2 and a degree-12 Taylor polynomial
 * (relative error about 2e-16); a below -708 (or NaN) is taken as -708, so 2^k stays a normal double. Plain
 * double arithmetic in one order (no FMA, no libm call): it vectorises, and gives the same bits everywhere (GELU,
 * gelu_native.c; the attention softmax, attention_native.c) */
static inline double neg_exp(double a) {
    a = a > -708.0 ? a : -708.0;
    a = a < 709.0 ? a : 709.0; /* a discarded padding lane may be positive: 2^k stays in range (no UB) */
    double k = floor(a * 1.4426950408889634 + 0.5);
    double r = (a - k * 0.6931471803691238) - k * 1.9082149292705877e-10;
    double p = 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    int64_t bits = ((int64_t)k + 1023) << 52;
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#endif
