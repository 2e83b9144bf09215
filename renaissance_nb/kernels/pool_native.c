/* rnb_parallel: the fixed blocks of a pass run by whichever threads are there to claim them.
 *
 * Why not an OpenMP team: a team's end barrier waits until every thread of the team has arrived, so a
 * worker the OS has not scheduled yet (a busy machine: 4 to 6 runnable threads on 2 cores) costs the
 * whole pass a scheduler slice. Measured on the 2-core EPYC VM at load 5: a 0.1 ms batch-norm pass took
 * 12-24 ms on a two-thread OpenMP team and the conv net's step 3.0x numba's, whose TBB pool lets the
 * calling thread do the blocks no worker took. Here the same: blocks are claimed one at a time from a
 * counter; the caller claims too and waits only for blocks a worker has claimed (so is running).
 * Which thread runs a block never changes a byte: each block's work and its output are fixed.
 *
 * The pool: up to RNB_POOL_MAX workers, started on first use, each spinning briefly after a job and then
 * sleeping on a condition variable. One job at a time (a second caller, say another Python thread,
 * runs its blocks on its own thread). After fork() the pool does not exist in the child: team() gives
 * one thread there, as for the OpenMP kernels.
 */
#include "native.h"
#include <sched.h>
#include <stdatomic.h>

#define RNB_POOL_MAX 63
#define CLOSED 0xFFFFFFFFull
#define SPINS 20000
#if defined(__x86_64__) || defined(__i386__)
#define RELAX() __builtin_ia32_pause()
#else
#define RELAX() ((void)0)
#endif

static struct {
    pthread_mutex_t job, mu;
    pthread_cond_t wake;
    int workers;              /* started */
    uint64_t gen;             /* the caller's: generations posted (under `job`) */
    atomic_uint_least64_t ticket; /* gen << 32 | next block (CLOSED: none to claim) */
    atomic_uintptr_t fn, ctx;
    atomic_int_least64_t blocks, done;
    atomic_int want;          /* workers 0..want-1 take part in the current job */
    uint64_t posted;          /* generation workers were woken for (under `mu`) */
} pool = {.job = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

/* claim and run blocks of the current job while there are any; false when none was left */
static int claim(uint64_t t) {
    uint64_t idx = t & CLOSED;
    rnb_block_fn f = (rnb_block_fn)atomic_load(&pool.fn);
    void *c = (void *)atomic_load(&pool.ctx);
    if (idx == CLOSED || (int64_t)idx >= atomic_load(&pool.blocks)) return 0;
    if (atomic_compare_exchange_weak(&pool.ticket, &t, t + 1)) { /* fails if the job changed since t */
        f(c, (i64)idx);
        atomic_fetch_add(&pool.done, 1);
    }
    return 1;
}

static void *worker(void *arg) {
    int me = (int)(intptr_t)arg;
    uint64_t seen = 0;
    for (;;) {
        uint64_t t = atomic_load(&pool.ticket);
        if (me < atomic_load(&pool.want) && claim(t)) continue;
        int spins = 0; /* nothing to claim: spin a little for the next job, then sleep */
        while (atomic_load(&pool.ticket) == t && ++spins < SPINS) RELAX();
        if (atomic_load(&pool.ticket) != t) continue;
        pthread_mutex_lock(&pool.mu);
        while (pool.posted == seen) pthread_cond_wait(&pool.wake, &pool.mu);
        seen = pool.posted;
        pthread_mutex_unlock(&pool.mu);
    }
    return NULL;
}

static int start_workers(int n) { /* under `job` */
    while (pool.workers < n && pool.workers < RNB_POOL_MAX) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&th, &at, worker, (void *)(intptr_t)pool.workers);
        pthread_attr_destroy(&at);
        if (failed) break;
        pool.workers++;
    }
    return pool.workers;
}

void rnb_parallel(int threads, i64 blocks, rnb_block_fn fn, void *ctx) {
    threads = team(threads);
    if (threads <= 1 || blocks <= 1 || pthread_mutex_trylock(&pool.job) != 0) {
        for (i64 b = 0; b < blocks; b++) fn(ctx, b);
        return;
    }
    int helpers = start_workers(threads - 1);
    if (helpers > threads - 1) helpers = threads - 1;
    uint64_t gen = ++pool.gen & 0xFFFFFFFFull;
    atomic_store(&pool.ticket, gen << 32 | CLOSED); /* before the fields change: stale claims fail */
    atomic_store(&pool.fn, (uintptr_t)fn);
    atomic_store(&pool.ctx, (uintptr_t)ctx);
    atomic_store(&pool.blocks, blocks);
    atomic_store(&pool.done, 0);
    atomic_store(&pool.want, helpers);
    atomic_store(&pool.ticket, gen << 32);
    pthread_mutex_lock(&pool.mu);
    pool.posted++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    for (;;) { /* the caller claims blocks too */
        uint64_t t = atomic_load(&pool.ticket);
        if ((int64_t)(t & CLOSED) >= blocks) break;
        if (atomic_compare_exchange_weak(&pool.ticket, &t, t + 1)) {
            fn(ctx, (i64)(t & CLOSED));
            atomic_fetch_add(&pool.done, 1);
        }
    }
    for (int spins = 0; atomic_load(&pool.done) < blocks; spins++) /* only blocks a worker is running */
        if (spins > SPINS) sched_yield(); else RELAX();
    pthread_mutex_unlock(&pool.job);
}
