/* Low-precision storage for mixed precision: bf16 and fp16 conversions, GradScaler's unscale, and
 * GEMMs with bf16/fp16 operands and fp32 accumulation (kernels/lowp.py binds them).
 *
 * Formats (RNB_F32, RNB_BF16, RNB_F16): bf16 is the high half of a float32, stored as uint16; fp16 is
 * IEEE binary16. float32 -> low precision rounds to nearest even, keeps subnormals, overflows to inf;
 * a NaN stays a quiet NaN with its sign and top payload bits (what vcvtneps2bf16 and vcvtps2ph
 * write); fp16 -> float32 quiets a NaN as vcvtph2ps does. Every routine has a portable scalar form
 * and, where the compiler targets them, AVX-512 BF16 / AVX-512F / F16C forms with the same bytes
 * (tests/test_lowp_kernels.py checks every fp16 and bf16 pattern both ways).
 *
 * The GEMMs never split the k sum: a C element is summed by one thread in one fixed order, and the
 * cut of the product into tiles or sgemm bands depends on its shape only, so the thread count never
 * changes a byte. Scratch comes from the caller (rnb_lowp_gemm_scratch says how much); nothing here
 * allocates.
 */
#include "native.h"
#ifdef __x86_64__
#include <immintrin.h>
#endif

enum { RNB_F32 = 0, RNB_BF16 = 1, RNB_F16 = 2 };
enum { PATH_AUTO = 0, PATH_DPBF16 = 1, PATH_SGEMM = 2, PATH_LOOPS = 3 };
#define LOWP_PAR_MIN 32768 /* elements below which a conversion stays on the calling thread */

/* bit 0: AVX-512 BF16, bit 1: AVX-512F, bit 2: F16C (what this build's vector forms use) */
int rnb_lowp_built(void) {
    int f = 0;
#ifdef __AVX512BF16__
    f |= 1;
#endif
#ifdef __AVX512F__
    f |= 2;
#endif
#ifdef __F16C__
    f |= 4;
#endif
    return f;
}

/* ---- scalar conversions ------------------------------------------------------------------------ */
static inline uint32_t bits_of(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float float_of(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

static inline uint16_t bf16_of(float x) {
    uint32_t u = bits_of(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float bf16_to(uint16_t h) { return float_of((uint32_t)h << 16); }

static inline uint16_t f16_of(float x) {
    uint32_t u = bits_of(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a >= 0x38800000u) /* a normal half: round at bit 13, rebias the exponent 127 -> 15 */
        return (uint16_t)(sign | ((a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13));
    if (a <= 0x33000000u) return (uint16_t)sign; /* at most 2^-25: rounds to zero (the tie to even) */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, s = 126 - e; /* units of 2^-24, s in 14..24 */
    uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
    q += (rem > half) || (rem == half && (q & 1u));
    return (uint16_t)(sign | q);
}

static inline float f16_to(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 31) return float_of(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
    if (e) return float_of(sign | ((e + 112u) << 23) | (m << 13));
    return float_of(sign | bits_of((float)m * 5.9604644775390625e-8f)); /* m * 2^-24, exact */
}

/* ---- one row of a conversion: vector forms, then the scalar tail ------------------------------- */
static void row_to_lowp(const float *s, uint16_t *d, i64 n, int fmt, int portable) {
    i64 j = 0;
    (void)portable; /* unused where no vector form is built */
    if (fmt == RNB_BF16) {
#if defined(__AVX512BF16__)
        if (!portable) {
            const __m512i expo = _mm512_set1_epi32(0x7f800000), bias = _mm512_set1_epi32(0x7fff);
            const __m512i one = _mm512_set1_epi32(1);
            for (; j + 16 <= n; j += 16) {
                __m512 x = _mm512_loadu_ps(s + j);
                __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
                __m512i u = _mm512_castps_si512(x);
                __mmask16 sub = _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, expo), _mm512_setzero_si512());
                if (sub) { /* the instruction flushes subnormal inputs; round them as the scalar form does */
                    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
                    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), 16);
                    h = _mm256_mask_blend_epi16(sub, h, _mm512_cvtepi32_epi16(r));
                }
                _mm256_storeu_si256((__m256i *)(d + j), h);
            }
        }
#endif
        for (; j < n; j++) d[j] = bf16_of(s[j]);
        return;
    }
#if defined(__AVX512F__)
    if (!portable)
        for (; j + 16 <= n; j += 16)
            _mm256_storeu_si256((__m256i *)(d + j),
                                _mm512_cvtps_ph(_mm512_loadu_ps(s + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
    if (!portable)
        for (; j + 8 <= n; j += 8)
            _mm_storeu_si128((__m128i *)(d + j), _mm256_cvtps_ph(_mm256_loadu_ps(s + j), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; j < n; j++) d[j] = f16_of(s[j]);
}

static void row_to_f32(const uint16_t *s, float *d, i64 n, int fmt, int portable) {
    i64 j = 0;
    (void)portable;
    if (fmt == RNB_BF16) {
#if defined(__AVX512F__)
        if (!portable)
            for (; j + 16 <= n; j += 16) {
                __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + j)));
                _mm512_storeu_si512((void *)(d + j), _mm512_slli_epi32(w, 16));
            }
#endif
        for (; j < n; j++) d[j] = bf16_to(s[j]);
        return;
    }
#if defined(__AVX512F__)
    if (!portable)
        for (; j + 16 <= n; j += 16)
            _mm512_storeu_ps(d + j, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + j))));
#elif defined(__F16C__)
    if (!portable)
        for (; j + 8 <= n; j += 8) _mm256_storeu_ps(d + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + j))));
#endif
    for (; j < n; j++) d[j] = f16_to(s[j]);
}

/* ---- 2-D strided conversions, threaded over fixed chunks --------------------------------------- */
typedef struct {
    int from, to, portable;
    const void *src;
    void *dst;
    i64 rows, cols, lds, ldd;
} convert_job;

static void convert_part(const convert_job *c, i64 r0, i64 r1, i64 c0, i64 c1) {
    for (i64 i = r0; i < r1; i++) {
        if (c->from == RNB_F32)
            row_to_lowp((const float *)c->src + i * c->lds + c0, (uint16_t *)c->dst + i * c->ldd + c0, c1 - c0, c->to,
                        c->portable);
        else
            row_to_f32((const uint16_t *)c->src + i * c->lds + c0, (float *)c->dst + i * c->ldd + c0, c1 - c0,
                       c->from, c->portable);
    }
}

/* chunk t of RNB_CHUNKS: rows when there are at least RNB_CHUNKS of them, else columns cut at multiples of 16 */
static void convert_chunk(const convert_job *c, i64 t) {
    if (c->rows >= RNB_CHUNKS) {
        convert_part(c, cut(c->rows, RNB_CHUNKS, t), cut(c->rows, RNB_CHUNKS, t + 1), 0, c->cols);
    } else {
        i64 blocks = (c->cols + 15) / 16;
        i64 lo = min64(c->cols, cut(blocks, RNB_CHUNKS, t) * 16), hi = min64(c->cols, cut(blocks, RNB_CHUNKS, t + 1) * 16);
        convert_part(c, 0, c->rows, lo, hi);
    }
}

static void convert_block(void *c, i64 t) { convert_chunk((const convert_job *)c, t); }

static void run_convert(const convert_job *c, int threads) {
    if (team(threads) <= 1 || c->rows * c->cols < LOWP_PAR_MIN) {
        convert_part(c, 0, c->rows, 0, c->cols);
        return;
    }
    rnb_parallel(threads, RNB_CHUNKS, convert_block, (void *)c);
}

/* dst = src converted, over rows x cols with row strides in elements; one side float32, the other
 * bf16 or fp16. portable: the scalar forms only (tests compare them with the vector forms).
 * Returns 0, or -1 for a pair of formats it does not convert. */
int rnb_lowp_convert(int from, int to, const void *src, i64 rows, i64 cols, i64 lds, void *dst, i64 ldd, int portable,
                     int threads) {
    int ok = (from == RNB_F32 && (to == RNB_BF16 || to == RNB_F16)) || (to == RNB_F32 && (from == RNB_BF16 || from == RNB_F16));
    if (!ok) return -1;
    convert_job c = {from, to, portable, src, dst, rows, cols, lds, ldd};
    run_convert(&c, threads);
    return 0;
}

/* ---- GradScaler's unscale (torch._amp_foreach_non_finite_check_and_unscale_) ----------------- */
#define UNSCALE_BLOCK 256

static int unscale_range(const void *g, int fmt, i64 lo, i64 hi, float s, float *out, int portable) {
    float buf[UNSCALE_BLOCK];
    uint32_t bad = 0;
    for (i64 i = lo; i < hi; i += UNSCALE_BLOCK) {
        i64 n = min64(UNSCALE_BLOCK, hi - i);
        const float *v = buf;
        if (fmt == RNB_F32) v = (const float *)g + i;
        else row_to_f32((const uint16_t *)g + i, buf, n, fmt, portable);
        for (i64 j = 0; j < n; j++) {
            float x = v[j];
            bad |= (bits_of(x) & 0x7f800000u) == 0x7f800000u;
            out[i + j] = s == 1.0f ? x : x * s;
        }
    }
    return (int)bad;
}

typedef struct {
    const void *g;
    int fmt, portable;
    i64 n;
    float s, *out;
    int bad[RNB_CHUNKS]; /* each block's own: no shared write */
} unscale_job;

static void unscale_block(void *v, i64 t) {
    unscale_job *u = v;
    i64 lo, hi;
    chunk(u->n, t, &lo, &hi);
    u->bad[t] = unscale_range(u->g, u->fmt, lo, hi, u->s, u->out, u->portable);
}

/* out[i] = float(g[i]) * inv_scale[0] in float32 (g bf16, fp16 or float32; out may be g when it is
 * float32); returns 1 if any g[i] is inf or NaN, and then also sets found[0] = 1 (found may be NULL;
 * it is never cleared here, as torch's found_inf). */
int rnb_lowp_unscale(const void *g, int fmt, i64 n, const float *inv_scale, float *out, float *found, int portable,
                     int threads) {
    float s = inv_scale[0];
    int bad = 0;
    if (team(threads) <= 1 || n < LOWP_PAR_MIN) {
        bad = unscale_range(g, fmt, 0, n, s, out, portable);
    } else {
        unscale_job u = {.g = g, .fmt = fmt, .portable = portable, .n = n, .s = s, .out = out};
        rnb_parallel(threads, RNB_CHUNKS, unscale_block, &u);
        for (int t = 0; t < RNB_CHUNKS; t++) bad |= u.bad[t];
    }
    if (bad && found) found[0] = 1.0f;
    return bad;
}

/* ---- GEMM: C(m, n) = op(A) op(B) [+ C], A and B bf16 or fp16, sums in float32 ------------------- */
typedef void (*sgemm64_fn)(int, int, int, i64, i64, i64, float, const float *, i64, const float *, i64, float, float *, i64);
typedef void (*sgemm32_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);

typedef struct {
    int fmt, ta, tb, beta, out;
    i64 m, n, k, lda, ldb, ldc;
    const uint16_t *a, *b;
    void *c;
} gemm_job;

#define MR 6  /* rows of a dpbf16 tile */
#define NR 64 /* columns of a dpbf16 tile (4 zmm) */
#define BAND_MIN 128 /* an sgemm band has at least this many rows or columns */
#define BAND_MAX 8

static inline i64 rup(i64 x, i64 q) { return (x + q - 1) / q * q; }

/* which path runs: the one asked for, if built and possible, else -1; PATH_AUTO picks dpbf16 for bf16
 * where it is built, else sgemm where a BLAS was given, else the plain loops */
int rnb_lowp_gemm_path(int fmt, int want, int have_sgemm) {
    int dp = 0;
    (void)fmt;
#ifdef __AVX512BF16__
    dp = fmt == RNB_BF16;
#endif
    if (want == PATH_AUTO) return dp ? PATH_DPBF16 : have_sgemm ? PATH_SGEMM : PATH_LOOPS;
    if (want == PATH_DPBF16) return dp ? PATH_DPBF16 : -1;
    if (want == PATH_SGEMM) return have_sgemm ? PATH_SGEMM : -1;
    return want == PATH_LOOPS ? PATH_LOOPS : -1;
}

/* scratch (in 4-byte elements) a product of this shape needs on a resolved path */
i64 rnb_lowp_gemm_scratch(int out, i64 m, i64 n, i64 k, int path) {
    if (path == PATH_DPBF16) return (rup(m, MR) + rup(n, NR)) * ((k + 1) / 2);
    return m * k + k * n + (out != RNB_F32 ? m * n : 0);
}

/* the stored shape of an operand: op(X) is r x c; stored transposed it is c x r */
static inline void stored(i64 r, i64 c, int t, i64 *rows, i64 *cols) { *rows = t ? c : r; *cols = t ? r : c; }

/* how many bands of the larger side, from the shape alone; band b is [band_edge(b), band_edge(b + 1)) */
static i64 band_count(i64 m, i64 n) {
    i64 side = m >= n ? m : n, nb = side / BAND_MIN;
    return nb < 1 ? 1 : nb > BAND_MAX ? BAND_MAX : nb;
}

static inline i64 band_edge(i64 size, i64 nb, i64 b) {
    if (b >= nb) return size;
    i64 e = rup(cut(size, nb, b), 16);
    return e < size ? e : size;
}

static void sgemm_band(void *f, int wide, const gemm_job *j, const float *a32, i64 lda, const float *b32, i64 ldb,
                       float *c32, i64 ldc, i64 b, i64 nb) {
    int rows = j->m >= j->n;
    i64 lo = band_edge(rows ? j->m : j->n, nb, b), hi = band_edge(rows ? j->m : j->n, nb, b + 1);
    if (hi <= lo) return;
    i64 m = rows ? hi - lo : j->m, n = rows ? j->n : hi - lo;
    const float *pa = a32, *pb = b32;
    float *pc = c32;
    if (rows) { pa += j->ta ? lo : lo * lda; pc += lo * ldc; }
    else { pb += j->tb ? lo * ldb : lo; pc += lo; }
    int ta = j->ta ? 112 : 111, tb = j->tb ? 112 : 111;
    float beta = j->beta ? 1.0f : 0.0f;
    if (wide) ((sgemm64_fn)f)(101, ta, tb, m, n, j->k, 1.0f, pa, lda, pb, ldb, beta, pc, ldc);
    else ((sgemm32_fn)f)(101, ta, tb, (int)m, (int)n, (int)j->k, 1.0f, pa, (int)lda, pb, (int)ldb, beta, pc, (int)ldc);
}

/* plain loops: c32 row i (+)= sum over p of a(i, p) * b(p, :), p in order; b32 is op(B), k x n */
static void loops_rows(const gemm_job *j, const float *a32, i64 lda, const float *b32, float *c32, i64 ldc, i64 r0,
                       i64 r1) {
    for (i64 i = r0; i < r1; i++) {
        float *row = c32 + i * ldc;
        if (!j->beta) for (i64 q = 0; q < j->n; q++) row[q] = 0.0f;
        for (i64 p = 0; p < j->k; p++) {
            float av = j->ta ? a32[p * lda + i] : a32[i * lda + p];
            const float *br = b32 + p * j->n;
            for (i64 q = 0; q < j->n; q++) row[q] += av * br[q];
        }
    }
}

typedef struct { /* gemm_f32's products: a band of sgemm, or a chunk of rows of the loops, per block */
    const gemm_job *j;
    void *f;
    int wide;
    const float *a32;
    i64 lda;
    const float *b32;
    i64 ldb;
    float *c32;
    i64 ldc, blocks;
} f32_job;

static void sgemm_block(void *v, i64 b) {
    const f32_job *q = v;
    sgemm_band(q->f, q->wide, q->j, q->a32, q->lda, q->b32, q->ldb, q->c32, q->ldc, b, q->blocks);
}

static void loops_block(void *v, i64 t) {
    const f32_job *q = v;
    loops_rows(q->j, q->a32, q->lda, q->b32, q->c32, q->ldc, cut(q->j->m, RNB_CHUNKS, t), cut(q->j->m, RNB_CHUNKS, t + 1));
}

/* the float32 paths: operands to float32 in scratch, then OpenBLAS's sgemm in fixed bands (or the loops),
 * then the sums rounded to the output format */
static int gemm_f32(const gemm_job *j, int path, void *f, int wide, float *scratch, int portable, int threads) {
    i64 ar, ac, br, bc;
    stored(j->m, j->k, j->ta, &ar, &ac);
    stored(j->k, j->n, j->tb, &br, &bc);
    float *a32 = scratch, *b32 = a32 + j->m * j->k, *c32 = b32 + j->k * j->n;
    convert_job ca = {j->fmt, RNB_F32, portable, j->a, a32, ar, ac, j->lda, ac};
    run_convert(&ca, threads);
    if (path == PATH_LOOPS && j->tb) { /* op(B) laid out k x n for the inner loop */
        for (i64 p = 0; p < j->k; p++)
            for (i64 q = 0; q < j->n; q++)
                b32[p * j->n + q] = j->fmt == RNB_BF16 ? bf16_to(j->b[q * j->ldb + p]) : f16_to(j->b[q * j->ldb + p]);
    } else {
        convert_job cb = {j->fmt, RNB_F32, portable, j->b, b32, br, bc, j->ldb, bc};
        run_convert(&cb, threads);
    }
    i64 ldc = j->n;
    if (j->out == RNB_F32) { c32 = (float *)j->c; ldc = j->ldc; }
    else if (j->beta) {
        convert_job cc = {j->out, RNB_F32, portable, j->c, c32, j->m, j->n, j->ldc, ldc};
        run_convert(&cc, threads);
    }
    f32_job fj = {j, f, wide, a32, ac, b32, bc, c32, ldc, path == PATH_SGEMM ? band_count(j->m, j->n) : RNB_CHUNKS};
    rnb_parallel(threads, fj.blocks, path == PATH_SGEMM ? sgemm_block : loops_block, &fj);
    if (j->out != RNB_F32) {
        convert_job co = {RNB_F32, j->out, portable, c32, j->c, j->m, j->n, ldc, j->ldc};
        run_convert(&co, threads);
    }
    return 0;
}

/* ---- the AVX-512 BF16 path: vdpbf16ps tiles of MR x NR over packed pairs of k ------------------- *
 * vdpbf16ps adds two exact products per lane and step; it reads subnormal inputs as zero and flushes
 * subnormal results (Intel SDM), so bf16 operands below 2^-126 count as zero on this path only. */
#ifdef __AVX512BF16__
/* 16 x 16 uint32 transpose: o[j][i] = r[i][j] (unpacks within 128-bit lanes, then lane shuffles) */
static inline void transpose16(const __m512i r[16], __m512i o[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) { /* u[4g + c], lane L: column 4L + c of rows 4g .. 4g + 3 */
        u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int c = 0; c < 4; c++) {
        __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
        __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44), v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        o[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        o[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
        o[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        o[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
    }
}

/* pack_pairs for pairs contiguous in rows: whole 16 x 16 blocks of pairs transposed in registers;
 * returns how many pairs of k it packed (the caller packs the rest) */
static i64 pack_rows16(const uint16_t *src, i64 ld, i64 k, i64 cols, i64 w, uint32_t *d32) {
    i64 full = (k / 2) / 16 * 16;
    __m512i r[16], o[16];
    for (i64 q0 = 0; q0 + 16 <= cols; q0 += 16)
        for (i64 p2 = 0; p2 < full; p2 += 16) {
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512((const void *)(src + (q0 + i) * ld + 2 * p2));
            transpose16(r, o);
            for (int jj = 0; jj < 16; jj++) _mm512_storeu_si512((void *)(d32 + (p2 + jj) * w + q0), o[jj]);
        }
    return cols / 16 * 16 == cols ? full : 0;
}

/* pack_pairs for pairs taken from two rows: 32 columns of rows 2 p2 and 2 p2 + 1 interleaved at once */
static void pack_interleave(const uint16_t *src, i64 ld, i64 k, i64 cols, i64 w, uint16_t *dst) {
    __m512i lo_idx, hi_idx;
    uint16_t lo[32], hi[32];
    for (int t = 0; t < 16; t++) {
        lo[2 * t] = (uint16_t)t; lo[2 * t + 1] = (uint16_t)(32 + t);
        hi[2 * t] = (uint16_t)(16 + t); hi[2 * t + 1] = (uint16_t)(48 + t);
    }
    lo_idx = _mm512_loadu_si512((const void *)lo);
    hi_idx = _mm512_loadu_si512((const void *)hi);
    for (i64 p2 = 0; p2 < (k + 1) / 2; p2++) {
        const uint16_t *r0 = src + 2 * p2 * ld, *r1 = r0 + ld;
        for (i64 q = 0; q < w; q += 32) { /* columns past cols load as zeros */
            i64 left = cols - q;
            __mmask32 mk = left >= 32 ? (__mmask32)0xffffffffu : left <= 0 ? (__mmask32)0 : (__mmask32)((1u << left) - 1u);
            __m512i v0 = _mm512_maskz_loadu_epi16(mk, r0 + q);
            __m512i v1 = 2 * p2 + 1 < k ? _mm512_maskz_loadu_epi16(mk, r1 + q) : _mm512_setzero_si512();
            _mm512_storeu_si512((void *)(dst + (p2 * w + q) * 2), _mm512_permutex2var_epi16(v0, lo_idx, v1));
            _mm512_storeu_si512((void *)(dst + (p2 * w + q + 16) * 2), _mm512_permutex2var_epi16(v0, hi_idx, v1));
        }
    }
}

/* pairs of k: dst[(p2 * w + q) * 2 + h] = x(2 p2 + h, q) for q < cols, where x(p, q) = src[q * ld + p] when
 * pairs are contiguous in memory (by_rows), else src[p * ld + q]; lanes past cols or k stay zero */
static void pack_pairs(const uint16_t *src, i64 ld, int by_rows, i64 k, i64 cols, i64 w, uint16_t *dst) {
    i64 kp = (k + 1) / 2;
    if (!by_rows && w % 32 == 0) {
        pack_interleave(src, ld, k, cols, w, dst);
        return;
    }
    if (cols < w || (k & 1)) memset(dst, 0, (size_t)(kp * w * 2) * sizeof(uint16_t));
    if (by_rows) {
        uint32_t *d32 = (uint32_t *)dst;
        i64 done = w % 16 == 0 ? pack_rows16(src, ld, k, cols, w, d32) : 0;
        for (i64 q = 0; q < cols; q++) {
            const uint16_t *row = src + q * ld;
            for (i64 p2 = done; p2 < k / 2; p2++) {
                uint32_t v;
                memcpy(&v, row + 2 * p2, 4);
                d32[p2 * w + q] = v;
            }
            if (k & 1) dst[((k / 2) * w + q) * 2] = row[k - 1];
        }
    } else {
        for (i64 p = 0; p < k; p++) {
            const uint16_t *row = src + p * ld;
            uint16_t *d = dst + (p >> 1) * w * 2 + (p & 1);
            for (i64 q = 0; q < cols; q++) d[2 * q] = row[q];
        }
    }
}

/* op(B)'s columns [j0, j0 + NR): pb[(p2 * NR + q) * 2 + h] = op(B)[2 p2 + h, j0 + q] */
static void pack_b(const gemm_job *j, i64 j0, uint16_t *pb) {
    const uint16_t *src = j->b + (j->tb ? j0 * j->ldb : j0);
    pack_pairs(src, j->ldb, j->tb, j->k, min64(NR, j->n - j0), NR, pb);
}

/* op(A)'s rows [i0, i0 + MR): pa[(p2 * MR + r) * 2 + h] = op(A)[i0 + r, 2 p2 + h] */
static void pack_a(const gemm_job *j, i64 i0, uint16_t *pa) {
    const uint16_t *src = j->a + (j->ta ? i0 : i0 * j->lda);
    pack_pairs(src, j->lda, !j->ta, j->k, min64(MR, j->m - i0), MR, pa);
}

static void store_tile(const gemm_job *j, i64 i0, i64 j0, __m512 acc[MR][NR / 16]) {
    if (i0 + MR <= j->m && j0 + NR <= j->n && j->out == RNB_F32) { /* a whole tile of float32 sums */
        for (i64 r = 0; r < MR; r++) {
            float *pc = (float *)j->c + (i0 + r) * j->ldc + j0;
            for (i64 v = 0; v < NR / 16; v++)
                _mm512_storeu_ps(pc + 16 * v, j->beta ? _mm512_add_ps(_mm512_loadu_ps(pc + 16 * v), acc[r][v]) : acc[r][v]);
        }
        return;
    }
    for (i64 r = 0; r < MR && i0 + r < j->m; r++)
        for (i64 v = 0; v < NR / 16; v++) {
            i64 col = j0 + 16 * v, left = j->n - col;
            if (left <= 0) break;
            __mmask16 mk = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
            __m512 x = acc[r][v];
            if (j->out == RNB_F32) {
                float *pc = (float *)j->c + (i0 + r) * j->ldc + col;
                if (j->beta) x = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, pc), x);
                _mm512_mask_storeu_ps(pc, mk, x);
            } else {
                uint16_t *pc = (uint16_t *)j->c + (i0 + r) * j->ldc + col;
                float tmp[16];
                uint16_t h[16];
                _mm512_storeu_ps(tmp, x);
                if (j->beta) for (i64 q = 0; q < 16 && q < left; q++) tmp[q] += bf16_to(pc[q]);
                row_to_lowp(tmp, h, 16, RNB_BF16, 0);
                for (i64 q = 0; q < 16 && q < left; q++) pc[q] = h[q];
            }
        }
}

/* one MR x NR tile over all of k: row r's pair p2 of op(A) is at rows[r] + p2 * step (bytes: packed, or
 * A itself when its rows hold k in pairs), pb the packed panel of op(B) */
static void dp_tile(const gemm_job *j, const char *const rows[MR], i64 step, const uint16_t *pb, i64 i0, i64 j0) {
    __m512 acc[MR][NR / 16];
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NR / 16; v++) acc[r][v] = _mm512_setzero_ps();
    i64 kp = (j->k + 1) / 2;
    for (i64 p2 = 0; p2 < kp; p2++) {
        const uint16_t *bp = pb + p2 * 2 * NR;
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp), b1 = (__m512bh)_mm512_loadu_si512(bp + 32);
        __m512bh b2 = (__m512bh)_mm512_loadu_si512(bp + 64), b3 = (__m512bh)_mm512_loadu_si512(bp + 96);
        #pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            uint32_t pair;
            memcpy(&pair, rows[r] + p2 * step, 4);
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)pair);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
            acc[r][2] = _mm512_dpbf16_ps(acc[r][2], av, b2);
            acc[r][3] = _mm512_dpbf16_ps(acc[r][3], av, b3);
        }
    }
    store_tile(j, i0, j0, acc);
}

/* the tile of row block rb: A read in place when its rows hold k in whole pairs (rows past m repeat
 * the last one: their sums are never stored), else the packed block */
static void row_block_tile(const gemm_job *j, const uint16_t *pa, i64 kp, const uint16_t *pb, i64 rb, i64 cb) {
    const char *rows[MR];
    i64 i0 = rb * MR;
    if (!j->ta && !(j->k & 1)) {
        for (int r = 0; r < MR; r++) rows[r] = (const char *)(j->a + min64(i0 + r, j->m - 1) * j->lda);
        dp_tile(j, rows, 4, pb + cb * NR * kp * 2, i0, cb * NR);
    } else {
        for (int r = 0; r < MR; r++) rows[r] = (const char *)(pa + rb * MR * kp * 2 + 2 * r);
        dp_tile(j, rows, 4 * MR, pb + cb * NR * kp * 2, i0, cb * NR);
    }
}

typedef struct { /* gemm_dpbf16's three passes, a block each: pack a row block, pack a column block, a tile */
    const gemm_job *j;
    uint16_t *pa, *pb;
    i64 kp, mb;
} dp_job;

static void pack_a_block(void *v, i64 t) {
    const dp_job *q = v;
    pack_a(q->j, t * MR, q->pa + t * MR * q->kp * 2);
}

static void pack_b_block(void *v, i64 t) {
    const dp_job *q = v;
    pack_b(q->j, t * NR, q->pb + t * NR * q->kp * 2);
}

static void tile_block(void *v, i64 t) {
    const dp_job *q = v;
    row_block_tile(q->j, q->pa, q->kp, q->pb, t % q->mb, t / q->mb);
}

static int gemm_dpbf16(const gemm_job *j, uint16_t *scratch, int threads) {
    i64 kp = (j->k + 1) / 2, mb = rup(j->m, MR) / MR, nbk = rup(j->n, NR) / NR;
    dp_job q = {j, scratch, scratch + rup(j->m, MR) * kp * 2, kp, mb};
    int direct = !j->ta && !(j->k & 1);
    if (j->m * j->n * j->k < (1 << 18)) threads = 1;
    if (!direct) rnb_parallel(threads, mb, pack_a_block, &q);
    rnb_parallel(threads, nbk, pack_b_block, &q);
    rnb_parallel(threads, nbk * mb, tile_block, &q);
    return 0;
}
#endif

/* c = op(a) op(b) (+ c when beta), a and b in fmt (bf16 or fp16, uint16 storage), c float32 (out = RNB_F32)
 * or rounded to fmt (out = fmt); ta/tb: the operand is stored transposed; strides in elements.
 * sgemm: a CBLAS sgemm's address (wide: 64-bit integers) or NULL. scratch: rnb_lowp_gemm_scratch(...)
 * 4-byte elements. Returns the path that ran, or -1 (path not available), -2 (scratch too small),
 * -3 (bad formats). */
int rnb_lowp_gemm(int fmt, int ta, int tb, i64 m, i64 n, i64 k, const uint16_t *a, i64 lda, const uint16_t *b, i64 ldb,
                  int beta, void *c, i64 ldc, int out, void *sgemm, int wide, float *scratch, i64 scratch_elems,
                  int want, int portable, int threads) {
    if ((fmt != RNB_BF16 && fmt != RNB_F16) || (out != RNB_F32 && out != fmt)) return -3;
    int path = rnb_lowp_gemm_path(fmt, want, sgemm != NULL);
    if (path < 0) return -1;
    if (scratch_elems < rnb_lowp_gemm_scratch(out, m, n, k, path)) return -2;
    if (m <= 0 || n <= 0) return path;
    if (k <= 0) { /* an empty sum: c = 0, or c unchanged with beta (no BLAS call with a zero leading dimension) */
        size_t width = out == RNB_F32 ? 4 : 2;
        if (!beta)
            for (i64 i = 0; i < m; i++) memset((char *)c + (size_t)(i * ldc) * width, 0, (size_t)n * width);
        return path;
    }
    gemm_job j = {fmt, ta, tb, beta, out, m, n, k, lda, ldb, ldc, a, b, c};
#ifdef __AVX512BF16__
    if (path == PATH_DPBF16) return gemm_dpbf16(&j, (uint16_t *)scratch, threads), path;
#endif
    gemm_f32(&j, path, sgemm, wide, scratch, portable, threads);
    return path;
}
