/* GELU's two forms as vectorised passes (ops/activation.py gelu, ops/gelu_tanh.py), and the math they share
 * with their numba twins (kernels/gelu_math.py): the normal CDF Phi and the logistic function, on native.h's
 * neg_exp.
 *
 * Why not libm: glibc's erf, exp and tanh are scalar calls (erf about 7 ns an element here), so GELU and its
 * gradient were a third of a GPT's CPU step; and their last bits differ between libm versions, so the
 * same seed gave other bytes on another machine. These are plain double arithmetic in one fixed order
 * (no FMA: -ffp-contract=off), so the loops vectorise and numba's twins give the same bytes everywhere.
 *
 * Phi(z) = 1 - erfc(x)/2 (z >= 0) or erfc(x)/2 (z < 0), x = |z|/sqrt 2, with erfc(x) = t Q(t) exp(-x^2),
 * t = 1/(1 + 0.3 x) and Q a degree-16 polynomial fitted to erfcx (relative error below 1e-13 on
 * 0 <= x <= 10.5; beyond, erfc(x) < 1e-49 and t is held at 10.5's). Rounded once to float32. How the table was
 * fitted: a least-squares fit on 400 Chebyshev points of t in [1/(1 + 0.3 * 10.5), 1] against mpmath's erfc;
 * tests/test_gelu_native.py checks the result against libm's erfc.
 */
#include "native.h"

/* gelu_math.ERFC_Q reads this table (one source for both twins) */
static const double ERFC_Q[] = {
    0.1692568062837858, 0.16925942567014846, 0.1615964809799051, 0.1468707307515595,
    0.1212093089193599, 0.11620008783689315, -0.0020642618367039123, 0.26774167592412634,
    -0.5194787056803924, 1.025596208614495, -1.4948866606814144, 1.6640583779631606,
    -1.393673807993944, 0.8179206088545231, -0.31237548184004527, 0.0696890809196257,
    -0.006919874685105692,
};
#define ERFC_DEGREE ((int)(sizeof ERFC_Q / sizeof ERFC_Q[0]) - 1)
#define ERFC_T_SCALE 0.3
#define ERFC_X_MAX 10.5
#define INV_SQRT2 0.7071067811865476
#define INV_SQRT_2PI 0.3989422804014327
#define SQRT_2_OVER_PI 0.7978845608028654

/* gelu_math.normal_cdf: Phi(z), and *density = exp(-z^2/2) (the gradient's Gaussian, without 1/sqrt(2 pi)) */
static inline double normal_cdf(double z, double *density) {
    double x = fabs(z) * INV_SQRT2;
    double t = 1.0 / (1.0 + ERFC_T_SCALE * (x < ERFC_X_MAX ? x : ERFC_X_MAX));
    double q = ERFC_Q[ERFC_DEGREE];
    #pragma GCC unroll 16 /* unrolled at -O2 too: the pass's loop then vectorises */
    for (int i = ERFC_DEGREE - 1; i >= 0; i--) q = q * t + ERFC_Q[i];
    double e = neg_exp(-(x * x));
    double half_erfc = 0.5 * ((t * q) * e);
    *density = e;
    return z < 0 ? half_erfc : 1.0 - half_erfc;
}

/* gelu_math.logistic: sigmoid(v) = 1/(1 + exp(-v)), and *slope = sigmoid(v) (1 - sigmoid(v)), from e = exp(-|v|)
 * with no cancellation on either side (GELU's tanh form is x sigmoid(2u): 1 + tanh(u) = 2 sigmoid(2u)) */
static inline double logistic(double v, double *slope) {
    double e = neg_exp(-fabs(v));
    double d = 1.0 / (1.0 + e);
    *slope = (e * d) * d;
    return v < 0 ? e * d : d;
}

typedef struct {
    const float *x, *dy;
    float *out;
    i64 n;
    int form; /* 0: the erf form, 1: the tanh form */
} gelu_pass;

static void gelu_erf_range(const float *x, const float *dy, float *out, i64 lo, i64 hi) {
    if (dy == NULL) {
        #pragma omp simd
        for (i64 k = lo; k < hi; k++) {
            double z = x[k], e;
            out[k] = (float)(z * normal_cdf(z, &e));
        }
    } else {
        #pragma omp simd
        for (i64 k = lo; k < hi; k++) {
            double z = x[k], e;
            double g = normal_cdf(z, &e) + z * (e * INV_SQRT_2PI);
            out[k] = (float)((double)dy[k] * g);
        }
    }
}

/* x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): PyTorch's x/2 (1 + tanh u) without its cancellation where
 * u is very negative; the gradient sigmoid(2u) + 2 x sigmoid'(2u) du/dx */
static void gelu_tanh_range(const float *x, const float *dy, float *out, i64 lo, i64 hi) {
    if (dy == NULL) {
        #pragma omp simd
        for (i64 k = lo; k < hi; k++) {
            double z = x[k], sl;
            out[k] = (float)(z * logistic(2.0 * (SQRT_2_OVER_PI * (z + 0.044715 * z * z * z)), &sl));
        }
    } else {
        #pragma omp simd
        for (i64 k = lo; k < hi; k++) {
            double z = x[k], sl;
            double s = logistic(2.0 * (SQRT_2_OVER_PI * (z + 0.044715 * z * z * z)), &sl);
            double g = s + ((z * (2.0 * sl)) * SQRT_2_OVER_PI) * (1.0 + 0.134145 * z * z);
            out[k] = (float)((double)dy[k] * g);
        }
    }
}

static void gelu_block(void *v, i64 c) {
    const gelu_pass *a = v;
    i64 lo, hi;
    chunk(a->n, c, &lo, &hi);
    (a->form ? gelu_tanh_range : gelu_erf_range)(a->x, a->dy, a->out, lo, hi);
}

/* out = gelu(x) (dy NULL) or dy * gelu'(x), over n flat values in RNB_CHUNKS blocks on the pool (element-wise:
 * the same bytes on any thread count) */
void rnb_gelu(const float *x, const float *dy, float *out, i64 n, int form, int threads) {
    gelu_pass a = {.x = x, .dy = dy, .out = out, .n = n, .form = form};
    rnb_parallel(threads, RNB_CHUNKS, gelu_block, &a);
}
