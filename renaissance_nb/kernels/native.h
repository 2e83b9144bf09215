/* What every C source of the CPU kernels shares (native.py compiles them into one library):
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

/* one thread after a fork (native.c says why) */
extern volatile int rnb_forked; /* set in a forked child (native.c) */
static inline int team(int threads) { return rnb_forked ? 1 : threads; } /* native.py checks it: a stale library is rebuilt, never called */

/* pool_native.c: fn(ctx, b) for every block b < blocks, on up to `threads` threads (the caller's among
 * them), each block by whichever thread claims it first: a block's work must not depend on its thread */
typedef void (*rnb_block_fn)(void *ctx, i64 block);
void rnb_parallel(int threads, i64 blocks, rnb_block_fn fn, void *ctx);

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

#endif
