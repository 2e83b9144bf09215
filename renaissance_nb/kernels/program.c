/* The CPU step as one native program (kernels/program.py builds it): the CPU counterpart of a CUDA graph.
 *
 * A program is an array of ops, each a thunk (generated from signatures.py's SIGNATURES: it unpacks an
 * argument block and calls one C kernel) and its argument block, whose addresses point into the arena.
 * rnb_run_steps runs the programs of steps [first, last) in order, so a replay of N steps is one call
 * from Python instead of one call per kernel. The host is re-entered only where it must act:
 *  - a guard trips (a batch's bounds check failed, the NaN probe found a non-finite value): the call
 *    returns RNB_HOST with the step and op in where[], the host runs that kernel's Python path (which
 *    raises, or sets the skip flag) and calls again from the next op;
 *  - SIGINT arrived (watch_sigint): the call returns RNB_STOPPED at the next step boundary, where[0]
 *    the steps done; the previous handler (Python's) was chained, so Python sees the Ctrl-C too.
 * Control flow a kernel did in Python becomes an op: RNB_SKIP[_CLEAR] jumps over the next n ops when an
 * int64 flag is set (the optimizer's "this update was flagged by the NaN check"). Nothing allocates.
 */
#include "native.h"
#include <signal.h>

typedef union { i64 i; double d; void *p; } rnb_arg;
typedef void (*rnb_thunk)(const rnb_arg *a, rnb_arg *r);

typedef struct {
    rnb_thunk fn;        /* NULL for a skip op */
    const rnb_arg *args; /* the argument block, one 8-byte slot per argument */
    i64 kind;            /* RNB_PLAIN, RNB_STATUS, RNB_FINITE, RNB_SKIP, RNB_SKIP_CLEAR */
    void *gp;            /* the guard's operand: the loss (float) for RNB_FINITE, the flag (int64) for a skip */
    i64 n;               /* a skip op: how many ops it jumps over */
} rnb_op;

enum { RNB_PLAIN = 0, RNB_STATUS = 1, RNB_FINITE = 2, RNB_SKIP = 3, RNB_SKIP_CLEAR = 4 };
enum { RNB_DONE = 0, RNB_HOST = 1, RNB_STOPPED = 2 };

static volatile sig_atomic_t sigint_seen = 0;
static struct sigaction chained;

static void on_sigint(int sig, siginfo_t *info, void *ctx) {
    sigint_seen = 1;
    if (chained.sa_flags & SA_SIGINFO) {
        if (chained.sa_sigaction) chained.sa_sigaction(sig, info, ctx);
    } else if (chained.sa_handler != SIG_DFL && chained.sa_handler != SIG_IGN) {
        chained.sa_handler(sig);
    }
}

/* Whether the guard of op o (its thunk gave r) asks the host to act. */
static inline int trips(const rnb_op *o, rnb_arg r) {
    if (o->kind == RNB_STATUS) return r.i != 0;
    if (o->kind == RNB_FINITE) {
        float loss = *(const float *)o->gp;
        return r.d != 0.0 || !(loss - loss == 0.0f); /* nan_check: probe() == 0.0 and loss - loss == 0.0 */
    }
    return 0;
}

/* Run ops [op0, nops) of one program; -1 when done, else the op whose guard tripped. */
static i64 run_ops(const rnb_op *ops, i64 nops, i64 op0) {
    for (i64 j = op0; j < nops; j++) {
        const rnb_op *o = ops + j;
        if (o->fn == NULL) { /* a skip op */
            i64 *flag = (i64 *)o->gp;
            if (*flag) {
                if (o->kind == RNB_SKIP_CLEAR) *flag = 0;
                j += o->n;
            }
            continue;
        }
        rnb_arg r;
        r.i = 0;
        o->fn(o->args, &r);
        if (o->kind != RNB_PLAIN && trips(o, r)) return j;
    }
    return -1;
}

/* steps: per step (address of its op array, its op count); runs steps [first, last) from op op0 of
 * the first. Returns RNB_DONE, RNB_HOST (where = step, op) or RNB_STOPPED (where[0] = steps done). */
i64 rnb_run_steps(const i64 *steps, i64 first, i64 last, i64 op0, i64 *where, int watch_sigint) {
    int watching = 0;
    struct sigaction now;
    if (watch_sigint && sigaction(SIGINT, NULL, &now) == 0 && ((now.sa_flags & SA_SIGINFO) ||
                                                              (now.sa_handler != SIG_DFL && now.sa_handler != SIG_IGN))) {
        /* only over a handler function (Python's): a default or ignored SIGINT keeps its meaning */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigint;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigint_seen = 0;
        watching = sigaction(SIGINT, &sa, &chained) == 0;
    }
    i64 status = RNB_DONE;
    for (i64 s = first; s < last; s++) {
        if (watching && s > first && sigint_seen) {
            where[0] = s;
            status = RNB_STOPPED;
            break;
        }
        i64 j = run_ops((const rnb_op *)(intptr_t)steps[2 * s], steps[2 * s + 1], s == first ? op0 : 0);
        if (j >= 0) {
            where[0] = s;
            where[1] = j;
            status = RNB_HOST;
            break;
        }
    }
    if (watching) sigaction(SIGINT, &chained, NULL);
    return status;
}

/* A contiguous copy (np.copyto between two arrays of one dtype and size) and a fill of zero bytes. */
void rnb_copy_bytes(char *dst, const char *src, i64 nbytes) { memmove(dst, src, (size_t)nbytes); }
void rnb_zero_bytes(char *dst, i64 nbytes) { memset(dst, 0, (size_t)nbytes); }

/* ---- steps whose Python glue computed a value between C calls (kernels/cpu.py), as one C call each ---- */
void rnb_ema(float *e, const float *w, i64 n, double decay);
double rnb_sq_sum(const float *x, i64 n, int threads);
void rnb_scale(float *x, i64 n, float factor, int threads);

/* ema_update: d = min(decay, (1 + t) / (10 + t)), t the finished steps (Python's min keeps decay unless
 * the warm-up value is smaller), then E = d E + (1 - d) W */
void rnb_ema_warm(float *e, const float *w, i64 n, const i64 *step, double decay) {
    double t = (double)step[0];
    double d = (1.0 + t) / (10.0 + t);
    rnb_ema(e, w, n, d < decay ? d : decay);
}

/* clip_grad_norm: norm = float32(sqrt(sum of squares)), factor = max_norm / (norm + 1e-6) in float32;
 * out = [norm, factor applied]; every gradient times factor when it is below 1 or NaN */
void rnb_clip_norm(float *x, i64 n, float *out, float max_norm, int threads) {
    float norm = (float)sqrt(rnb_sq_sum(x, n, threads));
    float factor = max_norm / (norm + 1e-6f);
    out[0] = norm;
    if (factor >= 1.0f) {
        out[1] = 1.0f;
        return;
    }
    out[1] = factor;
    rnb_scale(x, n, factor, threads);
}
