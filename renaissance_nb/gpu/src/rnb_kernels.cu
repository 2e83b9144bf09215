// renaissance_nb: the GPU backend's kernels (compiled by NVRTC through cupy.RawModule, with
// rnb_device.cuh prepended). Every kernel reads its per-step scalars (step, learning rate,
// cursor, RNG offset) from arena memory, so a captured CUDA graph replays them unchanged and
// still does new work each step. Reductions use one block and a fixed tree, never atomics on
// floats, so two runs give the same bytes.

#ifndef RNB_THREADS
#define RNB_THREADS 256  // the block size of the one-block reduction in rnb_softmax_xent
#endif

extern "C" __global__ void rnb_bias_act(float* y, const float* b, int n, int m, int has_b, int act, double slope) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < (rnb_i64)n * m;
         k += (rnb_i64)gridDim.x * blockDim.x) {
        float z = y[k];
        if (has_b) z = z + b[k % m];
        y[k] = rnb_bias_act(z, act, slope);
    }
}

// dy *= act'(y) in place, written with the output y (the bias gradient is then a cuBLAS product).
extern "C" __global__ void rnb_act_grad(float* dy, const float* y, rnb_i64 n, int act, double slope) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x)
        dy[k] = rnb_act_grad_from_output(dy[k], y[k], act, slope);
}

extern "C" __global__ void rnb_act_fwd(const float* x, float* y, rnb_i64 n, int act, double slope) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x)
        y[k] = rnb_act_forward(x[k], act, slope);
}

extern "C" __global__ void rnb_act_bwd(const float* dy, const float* x, float* dx, rnb_i64 n, int act, double slope) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x)
        dx[k] = rnb_act_backward(dy[k], x[k], act, slope);
}

extern "C" __global__ void rnb_mul(float* out, const float* a, const float* b, rnb_i64 n) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x)
        out[k] = a[k] * b[k];
}

// Dropout: one thread per Philox block of 4 masks; the block offset is read from the arena.
extern "C" __global__ void rnb_dropout(const float* x, float* y, float* mask, rnb_i64 n, const rnb_i64* offset,
                                       unsigned long long seed, unsigned int stream, float keep, float scale) {
    rnb_i64 blocks = (n + 3) / 4;
    rnb_u64 base = (rnb_u64)offset[0];
    for (rnb_i64 b = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; b < blocks; b += (rnb_i64)gridDim.x * blockDim.x) {
        rnb_u32 w[4];
        rnb_philox_block(seed, stream, base + (rnb_u64)b, w);
        for (int j = 0; j < 4; ++j) {
            rnb_i64 k = 4 * b + j;
            if (k < n) {
                float mk = rnb_dropout_mask(w[j], keep, scale);
                mask[k] = mk;
                y[k] = x[k] * mk;
            }
        }
    }
}

// Advance an arena counter after the kernels that read it (a separate launch orders them).
extern "C" __global__ void rnb_advance(rnb_i64* counter, rnb_i64 by) { counter[0] += by; }

// The next batch: rows perm[cursor .. cursor + n) of the device copy of the data set. Rows past the
// order's end are zeros: only the executor's warm-up asks for them (a full batch of a set smaller
// than a batch), and a read past perm would index the data with whatever follows it.
extern "C" __global__ void rnb_gather(const float* xs, const int* ys, const rnb_i64* perm, rnb_i64 perm_n,
                                      const rnb_i64* cursor, float* x, int* y, int n, rnb_i64 d) {
    rnb_i64 start = cursor[0];
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < (rnb_i64)n * d;
         k += (rnb_i64)gridDim.x * blockDim.x) {
        rnb_i64 i = k / d;
        if (start + i >= perm_n) {
            x[k] = 0.0f;
            if (k - i * d == 0) y[i] = 0;
            continue;
        }
        rnb_i64 r = perm[start + i];
        x[k] = xs[r * d + (k - i * d)];
        if (k - i * d == 0) y[i] = ys[r];
    }
}

// Loss, top-1/top-5 counts and dlogits of a batch: one block, rows strided over its threads,
// then a fixed-order tree over the per-thread sums. With weighted != 0, class_weight holds the class
// weights (otherwise it is any array, unread); each thread sums the batch's target weights itself, in
// the CPU's order, so every thread has the same.
extern "C" __global__ void rnb_softmax_xent(const float* logits, const int* labels, const float* class_weight,
                                            int weighted, int n, int c, double smoothing, float* result,
                                            float* dlogits, int want_grad) {
    const float* weight = weighted ? class_weight : 0;
    __shared__ double s_loss[RNB_THREADS];
    __shared__ double s_top1[RNB_THREADS];
    __shared__ double s_top5[RNB_THREADS];
    int t = threadIdx.x;
    double inv_n = 1.0 / (double)n;
    double wsum = 0.0;
    if (weight) {
        double norm = 0.0;
        for (int i = 0; i < n; ++i) norm += (double)weight[labels[i]];
        inv_n = norm != 0.0 ? 1.0 / norm : 0.0;  // nothing to weigh: loss 0, no gradient (as the CPU)
        for (int j = 0; j < c; ++j) wsum += (double)weight[j];
    }
    double loss = 0.0, top1 = 0.0, top5 = 0.0;
    for (int i = t; i < n; i += RNB_THREADS) {
        int better;
        loss += rnb_xent_row(logits + (rnb_i64)i * c, c, labels[i], smoothing, inv_n, weight, wsum,
                             want_grad ? dlogits + (rnb_i64)i * c : 0, &better);
        if (better == 0) top1 += 1.0;
        if (better < 5) top5 += 1.0;
    }
    s_loss[t] = loss; s_top1[t] = top1; s_top5[t] = top5;
    __syncthreads();
    for (int h = RNB_THREADS / 2; h > 0; h >>= 1) {
        if (t < h) {
            s_loss[t] += s_loss[t + h];
            s_top1[t] += s_top1[t + h];
            s_top5[t] += s_top5[t + h];
        }
        __syncthreads();
    }
    if (t == 0) {
        result[0] = (float)(s_loss[0] * inv_n);
        result[1] = (float)s_top1[0];
        result[2] = (float)s_top5[0];
    }
}

extern "C" __global__ void rnb_accum_metrics(const float* result, double* acc, double batch, float* loss_log,
                                             rnb_i64 log_len, const rnb_i64* step) {
    acc[0] += (double)result[0] * batch;
    acc[1] += (double)result[1];
    acc[2] += (double)result[2];
    acc[3] += batch;
    if (log_len > 0) {
        rnb_i64 s = step[0];
        if (s < log_len) loss_log[s] = result[0];
    }
}

// NaN guard, part 1: any non-finite gradient sets the flag (benign identical writes).
extern "C" __global__ void rnb_nonfinite_probe(const float* g, rnb_i64 n, rnb_i64* flag) {
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x) {
        float x = g[k];
        if (!(x - x == 0.0f)) flag[0] = 1;
    }
}

// Part 2: a non-finite loss counts too; policy 0 ("raise") makes the flag 2, sticky: every later
// update is skipped and the host raises at its next look, with the weights of before the fault;
// policy 1 ("skip") skips this one update and counts it.
extern "C" __global__ void rnb_nonfinite_tally(const float* result, rnb_i64* flag, rnb_i64* skipped, int policy) {
    float l = result[0];
    if (flag[0] == 2) return;
    if (!(l - l == 0.0f)) flag[0] = 1;
    if (flag[0] == 1) {
        if (policy == 1) skipped[0] += 1;
        else flag[0] = 2;
    }
}

// clip_grad_norm, part 1: CLIP_BLOCKS blocks (graph/layers.py; a fixed count, so the order of the sums is
// the same on every GPU) each sum the squares of a strided share of the gradients in double, threads then a fixed
// tree, into partial[block]. The step the NaN check skips (flag set) is left alone; the flag is the
// same for every thread, so a block returns whole, before its barriers.
extern "C" __global__ void rnb_grad_sq_partials(const float* g, rnb_i64 n, const rnb_i64* flag, double* partial) {
    __shared__ double s_sq[RNB_THREADS];
    int t = threadIdx.x;
    if (flag[0]) return;
    double acc = 0.0;
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + t; k < n; k += (rnb_i64)gridDim.x * blockDim.x) {
        double x = (double)g[k];
        acc += x * x;
    }
    s_sq[t] = acc;
    __syncthreads();
    for (int h = RNB_THREADS / 2; h > 0; h >>= 1) {
        if (t < h) s_sq[t] += s_sq[t + h];
        __syncthreads();
    }
    if (t == 0) partial[blockIdx.x] = s_sq[0];
}

// clip_grad_norm, part 2 (one thread): the partial sums in block order, the norm rounded to float as
// torch's is, and clip = [norm, factor applied].
extern "C" __global__ void rnb_grad_norm(const double* partial, int blocks, const rnb_i64* flag, float max_norm,
                                         float* clip) {
    if (flag[0]) return;
    double s = 0.0;
    for (int b = 0; b < blocks; ++b) s += partial[b];
    float norm = (float)sqrt(s);
    float factor = max_norm / (norm + 1e-6f);
    clip[0] = norm;
    clip[1] = factor >= 1.0f ? 1.0f : factor;  // a NaN norm (nan_check off) makes every gradient NaN, as in torch
}

// clip_grad_norm, part 3: every gradient times the factor when it is below 1 or NaN (float32, as torch's mul_).
extern "C" __global__ void rnb_grad_scale(float* g, rnb_i64 n, const rnb_i64* flag, const float* clip) {
    if (flag[0]) return;
    float f = clip[1];
    if (f >= 1.0f) return;
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x)
        g[k] = g[k] * f;
}

extern "C" __global__ void rnb_adam(float* w, const float* g, float* m, float* v, rnb_i64 n, const float* lr_table,
                                    rnb_i64 lr_len, const rnb_i64* step, const rnb_i64* flag, double beta1,
                                    double beta2, double eps, double weight_decay, int decoupled, int maximize) {
    if (flag[0]) return;
    rnb_i64 t = step[0];
    double lr = (double)lr_table[t < lr_len - 1 ? t : lr_len - 1];
    RnbAdamScalars s = rnb_adam_scalars(lr, t + 1, beta1, beta2, eps, weight_decay);
    int has_wd = weight_decay != 0.0;
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x)
        rnb_adam_elem(w + k, g[k], m + k, v + k, s, decoupled, has_wd, maximize);
}

extern "C" __global__ void rnb_sgd(float* w, const float* g, float* m, rnb_i64 n, const float* lr_table,
                                   rnb_i64 lr_len, const rnb_i64* step, const rnb_i64* flag, float momentum,
                                   float one_damp, float wd, int has_wd, int use_m, int nesterov, int maximize) {
    if (flag[0]) return;
    rnb_i64 t = step[0];
    float lr = lr_table[t < lr_len - 1 ? t : lr_len - 1];
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x)
        rnb_sgd_elem(w + k, g[k], use_m ? m + k : m, lr, t == 0, momentum, one_damp, wd, has_wd, use_m, nesterov,
                     maximize);
}

// LARS's norms of one weight (optim/lars.py; one thread): the block partial sums of rnb_grad_sq_partials over w and
// over g, each added in block order, their square roots rounded to float: nrm = [||w||, ||g||].
extern "C" __global__ void rnb_lars_norms(const double* pw, const double* pg, int blocks, const rnb_i64* flag,
                                          float* nrm) {
    if (flag[0]) return;
    double sw = 0.0, sg = 0.0;
    for (int b = 0; b < blocks; ++b) sw += pw[b];
    for (int b = 0; b < blocks; ++b) sg += pg[b];
    nrm[0] = (float)sqrt(sw);
    nrm[1] = (float)sqrt(sg);
}

// LARS over one piece of the W/G/M ranges (kernels/fused.py lars_update, element for element): an adapted weight
// (adapt = 1) scales g + wd * w by its trust ratio from nrm = [||w||, ||g||]; an excluded run takes g as it is.
extern "C" __global__ void rnb_lars(float* w, const float* g, float* m, const float* nrm, rnb_i64 n,
                                    const float* lr_table, rnb_i64 lr_len, const rnb_i64* step, const rnb_i64* flag,
                                    double momentum, double weight_decay, double eta, double eps, int adapt) {
    if (flag[0]) return;
    rnb_i64 t = step[0];
    float lr = lr_table[t < lr_len - 1 ? t : lr_len - 1];
    float mom = (float)momentum, wd32 = (float)weight_decay, scale = 1.0f;
    if (adapt) {
        double wn = nrm[0], gn = nrm[1];
        if (wn > 0.0 && gn > 0.0) scale = (float)(eta * wn / (gn + weight_decay * wn + eps));
    }
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x) {
        float gk = g[k];
        if (adapt) gk = scale * (gk + wd32 * w[k]);
        float buf = rnb_flush(mom * m[k] + gk);
        m[k] = buf;
        w[k] = w[k] - lr * buf;
    }
}

// After the update: a skipped step (flag 1) is not a step; a halted task (flag 2) stays halted.
extern "C" __global__ void rnb_optimizer_done(rnb_i64* step, rnb_i64* flag) {
    if (flag[0] == 1) flag[0] = 0;
    else if (flag[0] == 0) step[0] += 1;
}

// The step counter only: an EMA update follows (rnb_ema skips a flagged step, rnb_skip_done clears flag 1).
extern "C" __global__ void rnb_optimizer_count(rnb_i64* step, rnb_i64* flag) {
    if (flag[0] == 0) step[0] += 1;
}

extern "C" __global__ void rnb_skip_done(rnb_i64* flag) {
    if (flag[0] == 1) flag[0] = 0;
}

extern "C" __global__ void rnb_ema(float* e, const float* w, rnb_i64 n, const rnb_i64* step, const rnb_i64* flag,
                                   double decay) {
    if (flag[0] != 0) return;  // a step the NaN check skipped (1) or halted (2) is not averaged in
    double dd = rnb_ema_decay(decay, step[0]);
    float d = (float)dd;
    float one_d = (float)(1.0 - dd);
    for (rnb_i64 k = blockIdx.x * (rnb_i64)blockDim.x + threadIdx.x; k < n; k += (rnb_i64)gridDim.x * blockDim.x)
        e[k] = rnb_ema_elem(e[k], w[k], d, one_d);
}
