"""Run the CUDA kernels whose threads cooperate inside a block (shared memory, __syncthreads) on
the CPU with every thread of a block: a test harness, not a backend.

tests/cuda_emulator.py runs a block's threads one after another, which is exact only for kernels
whose threads never talk, so it builds the block reductions with one thread. Here each thread of
a block is a real thread, but only one runs at a time: it runs until ``__syncthreads()`` or its
return, then hands over to the next in an order chosen per barrier phase (forward, reverse or
random). A barrier opens only when every thread still running waits at it; a barrier reached
after some threads of the block have returned (a hang or undefined behaviour on a GPU) is
counted in ``divergent`` and opened anyway, so a faulty kernel ends and the test reports it.
RNB_THREADS keeps the source's value (256, as NVRTC compiles it).
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np

from cuda_emulator import build

SHIM = r"""
#include <math.h>
#include <algorithm>
#include <memory>
#include <random>
#include <semaphore>
#include <thread>
#include <vector>
struct rnb_dim3 { unsigned int x, y, z; };
static thread_local rnb_dim3 threadIdx;
static rnb_dim3 blockIdx, blockDim, gridDim;
#define __global__
#define __shared__ static
static std::vector<std::unique_ptr<std::binary_semaphore>> emu_sem;
static std::vector<int> emu_state;  // 0 ready, 1 at the barrier, 2 returned
static std::vector<int> emu_order;
static std::mt19937 emu_rng(1);
static std::binary_semaphore emu_finished(0);
extern "C" { int emu_divergent = 0; int emu_barriers = 0; int emu_order_mode = 0; unsigned emu_seed = 1; }
static void emu_new_order() {
    int n = (int)emu_state.size();
    emu_order.resize(n);
    for (int i = 0; i < n; ++i) emu_order[i] = i;
    if (emu_order_mode == 1) std::reverse(emu_order.begin(), emu_order.end());
    else if (emu_order_mode == 2) std::shuffle(emu_order.begin(), emu_order.end(), emu_rng);
}
static int emu_next() {  // by the thread holding the turn: who runs next (-1: the block is done)
    for (int i : emu_order) if (emu_state[i] == 0) return i;
    int waiting = 0, done = 0;
    for (int s : emu_state) { if (s == 1) ++waiting; else if (s == 2) ++done; }
    if (waiting == 0) return -1;
    if (done) ++emu_divergent;
    ++emu_barriers;
    for (int &s : emu_state) if (s == 1) s = 0;
    emu_new_order();
    for (int i : emu_order) if (emu_state[i] == 0) return i;
    return -1;
}
static void emu_handover() {
    int next = emu_next();
    if (next >= 0) emu_sem[next]->release(); else emu_finished.release();
}
static void emu_sync() {
    int me = (int)threadIdx.x;
    emu_state[me] = 1;
    emu_handover();
    emu_sem[me]->acquire();
}
#define __syncthreads() emu_sync()
template <typename... P, typename... A>
static void rnb_emulate(void (*k)(P...), unsigned int grid, unsigned int block, A... args) {
    gridDim.x = grid; blockDim.x = block;
    gridDim.y = gridDim.z = blockDim.y = blockDim.z = 1;
    emu_rng.seed(emu_seed);
    emu_sem.clear();
    for (unsigned int t = 0; t < block; ++t) emu_sem.emplace_back(new std::binary_semaphore(0));
    for (unsigned int b = 0; b < grid; ++b) {
        blockIdx.x = b;
        emu_state.assign(block, 0);
        emu_new_order();
        std::vector<std::thread> threads;
        for (unsigned int t = 0; t < block; ++t)
            threads.emplace_back([=] {
                threadIdx.x = t; threadIdx.y = threadIdx.z = 0;
                emu_sem[t]->acquire();
                k(args...);
                emu_state[t] = 2;
                emu_handover();
            });
        emu_sem[emu_order[0]]->release();
        emu_finished.acquire();
        for (auto &th : threads) th.join();
    }
}
"""

ORDERS = {"forward": 0, "reverse": 1, "random": 2}


class BlockModule:
    """The package's CUDA source built with SHIM; ``call(name, grid, block, *args)`` runs a kernel with
    every thread of each block, in ``order``; ``divergent``/``barriers`` count what it saw."""

    def __init__(self, build_dir: Path) -> None:
        self.lib, self.signatures = build(build_dir, SHIM, ("-std=c++20", "-pthread"), "rnb_blocks")

    def _int(self, name: str) -> ctypes.c_int:
        return ctypes.c_int.in_dll(self.lib, name)

    def call(self, name: str, grid: int, block: int, *args: Any, order: str = "forward", seed: int = 1) -> None:
        self._int("emu_order_mode").value = ORDERS[order]
        ctypes.c_uint.in_dll(self.lib, "emu_seed").value = seed
        self._int("emu_divergent").value = 0
        self._int("emu_barriers").value = 0
        conv = [a.ctypes.data if ctype.endswith("*") else (a.item() if isinstance(a, np.generic) else a)
                for (ctype, _), a in zip(self.signatures[name], args)]
        getattr(self.lib, f"emu_{name}")(grid, block, *conv)

    @property
    def divergent(self) -> int:
        return self._int("emu_divergent").value

    @property
    def barriers(self) -> int:
        return self._int("emu_barriers").value
