"""The Runner: a compiled plan made runnable.

It owns the arena, the bind environment (seed, data sources, sample orders), the host
executor (every atlas capture bound once, views by name) and who replays the steps: that
executor on the CPU, the captured CUDA graphs on a GPU. It initialises the weights by the
task's init() scheme (runtime/init.py; PyTorch's own by default) and answers the few
questions the trainer, inference and checkpoints ask of the bound step (a view, a pass over
the validation data, the data order of an epoch).
"""
from __future__ import annotations

from typing import Any, cast

import numpy as np

from ..compiler.autocast import INIT_SCALE
from ..compiler.ids import GraphId
from ..compiler.stages import CompiledPlan
from ..config import TaskConfig
from ..errors import ConfigError, DeviceError
from ..kernels import blas, native
from ..kernels.base import BindBuffer
from ..kernels.cpu import BindEnv
from ..mpi import World, world
from ..train.rng import Philox, StreamId
from .arena import Arena
from .data_parallel import DataParallel
from .init import WeightInit
from .replay import EpochSchedule, Executor, StepPrograms, run_schedules
from .warmup import start_warmup


class Runner:
    """The bound step of one compiled task; ``replay`` is who runs it (CPU executor or GPU)."""

    def __init__(self, config: TaskConfig, compiled: CompiledPlan, lr_table: np.ndarray) -> None:
        from ..gpu.device import resolve_device
        assert config.data is not None  # plan_stage refused a task without data
        kind = resolve_device(config.device)
        self.config, self.compiled = config, compiled
        self._decoder: Any = None  # generate()'s decode step (runtime/decode.py), made when first asked for
        self.notes: list[str] = []  # what binding found (the device, the kernels chosen); the plan's are compiled.notes
        self.arena = Arena(compiled.plan)
        s = config.data
        sources = {"train": (s.train.x, s.train.y)}
        perms = {"train": np.arange(len(s.train), dtype=np.int64)}
        if s.val is not None:
            sources["val"] = (s.val.x, s.val.y)
            perms["val"] = np.arange(len(s.val), dtype=np.int64)
        w: World | None = world() if config.distributed else None  # MPI's COMM_WORLD on a distributed task
        self.dp = DataParallel(w) if w is not None else None
        self.env = BindEnv(config.seed, sources, perms, self.arena.range_view, self.arena.locate,
                           comm=w and w.comm, rank=w.rank if w else 0, ranks=config.ranks)
        if w is not None and w.size != config.ranks:
            raise ConfigError(f"compile: the task was planned for {config.ranks} ranks and runs on {w.size}. Fix: "
                              "call distributed('mpi') in the process that runs it, under mpiexec -n N.")
        if w is not None and kind == "cuda":
            kind = "cpu"  # plan() refused device('cuda'): 'auto' stays on the CPU
        if config.device == "auto" and kind == "cpu":
            from ..gpu.device import probe
            self.notes.append(f"device: auto chose the CPU: {probe()[1]}.")
        declined = len(native.DECLINED)
        self.executor = Executor(compiled, self.arena, self.env)
        self._initialise(lr_table)
        self.replay, self.device_kind = self._start_device(kind)
        numba_free = native.covers(self.executor.ops, declined)
        self.warmup = start_warmup(config, self.device_kind, numba_free)  # a first run: compile kernels on a second core

    @property
    def decoder(self) -> Any:
        """The compiled language model's one-token decode step, bound on first use to this arena's weights."""
        if self._decoder is None:
            from .decode import DecodeStep, decode_context
            arch = self.compiled.arch
            self._decoder = DecodeStep(arch, self.executor.weight_view, decode_context(arch, self.config.data))
        return self._decoder

    def _start_device(self, kind: str) -> tuple[StepPrograms, str]:
        """Who replays: the GPU backend when the device resolved to CUDA and it starts, else this host."""
        config, compiled = self.config, self.compiled
        if kind == "cuda":
            from ..gpu.executor import GpuExecutor
            try:  # the probe found a GPU; the backend can still fail to start (no NVRTC, cuBLAS, memory)
                gpu = GpuExecutor(compiled, self.executor, self.env, config.nan_policy, config.device_data,
                                  capture=config.device_capture)
            except Exception as exc:  # noqa: BLE001 - auto falls back on any of them, and says why
                if config.device == "cuda":
                    if isinstance(exc, DeviceError):
                        raise
                    raise DeviceError(f"device('cuda'): the GPU backend failed to start: {type(exc).__name__}: "
                                      f"{exc}. Fix: check CuPy's install (python -c 'import cupy; cupy.show_config()')"
                                      ", or use device('auto') to fall back to the CPU.") from exc
                self.notes.append(f"device: auto chose the CPU: {exc}")
            else:
                self.notes.append(f"device: CUDA, {len(gpu.atlas.captures)} atlas entries captured as CUDA "
                                  f"graphs on one device arena, data={gpu.data}, capture={gpu.capture}; "
                                  "the host arena mirrors the device's at epoch ends.")
                if config.precision != "fp32":
                    self.notes.append(f"mixed precision kernels: CUDA casts (rnb_amp.cu), fc by cublasGemmEx "
                                      f"({config.precision} operands, fp32 sums).")
                return gpu, "cuda"
        self.notes.append(f"device: CPU, {blas.describe()}; {native.plan_note(self.executor.ops)}.")
        self.notes.append(self.executor.capture_note(run_schedules(config, self.executor).base) + ".")
        if config.precision != "fp32":
            from ..kernels import lowp
            self.notes.append(f"mixed precision kernels: {lowp.path()}.")
        wino = self.executor.winograd_note()
        if wino:
            self.notes.append(f"convolutions by Winograd (3x3, stride 1): {wino}; every "
                              "other pass by im2col and GEMM. Both use the layer's cols scratch; RNB_WINOGRAD=0 "
                              "keeps im2col.")
        return self.executor, "cpu"

    def _initialise(self, lr_table: np.ndarray) -> None:
        """The weights by the task's init() scheme (runtime/init.py; by default PyTorch's own:
        U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for fc and conv weights and biases), drawn from Philox's
        INIT stream; BN weight 1, bias 0, running stats 0 and 1; EMA weights start equal to the weights."""
        config, ex = self.config, self.executor
        weights = WeightInit(config.seed, config.init, config.init_args)
        for p in self.compiled.params:
            view = ex.view("train_base", p.name)
            weights.fill(p, view)
            if config.ema is not None:
                ex.view("train_base", f"{p.name}@ema")[...] = view
        for v in ex.views.values():
            v[self.compiled.ids["ones"]].fill(1.0)
        ex.view("train_base", "lr_table")[: config.total_steps] = lr_table
        if "amp.scale" in self.compiled.ids:  # GradScaler's initial scale (fp16)
            ex.view("train_base", "amp.scale")[0] = INIT_SCALE
        if config.loss.weight_ is not None:
            ex.view("train_base", "loss.weight")[...] = config.loss.class_weights

    # ---- what the trainer, inference and checkpoints ask --------------------------------------------
    def view(self, name: str, variant: str = "train_base") -> np.ndarray:
        """The host view of a tensor (the canonical copy between runs)."""
        return self.executor.view(variant, name)

    def bind_buffers(self) -> list[tuple[str, BindBuffer]]:
        """(bound graph, buffer) for each buffer a kernel allocated at bind time outside the arena:
        none for a compiled task (its kernels' scratch are arena tensors); hand-built nodes' show here."""
        return list(self.executor.outside_arena)

    @property
    def perms(self) -> dict[str, np.ndarray]:
        """The sample order of each split (the running epoch's shuffle)."""
        return self.env.perms

    def drain_transfers(self) -> None:
        """Wait for background batch copies still writing an input buffer (after a stop, before a save)."""
        if not self.config.prefetch:
            return
        from ..kernels.transfer import buffer_slot
        for name in ("I_A.data", "I_B.data"):
            buffer_slot(self.view(name)).wait()

    def fold_bn(self, replay: StepPrograms | None = None) -> None:
        """The parameters inference reads, before any inference pass: batch norm's from its running
        statistics, and under mixed precision the weights' (and EMA weights') low-precision copies."""
        rx = replay or self.replay
        for gid in (GraphId.UPDATE_BN_INF_PARAMS, GraphId.CAST_MAIN_FP32_TO_FP16, GraphId.CAST_EMA_FP32_TO_FP16):
            for k in rx.kernels("val_base", gid):
                k()

    def run_eval(self, sched: EpochSchedule) -> np.ndarray:
        """One pass over the validation data; the metric sums (loss, top-1, top-5, count)."""
        rx = self.replay
        self.fold_bn()
        cursor, aug = self.view("cursor", "val_base"), self.view("aug.offset", "val_base")
        sums = self.view("metrics.sum", "val_base")
        cursor[0] = 0
        aug[0] = 0
        rx.push(cursor, aug)
        sched.replay()
        rx.pull(sums)
        return sums.copy()

    def shuffle_into(self, split: str, epoch: int) -> None:
        """The sample order of ``epoch``: a Philox permutation keyed by (seed, epoch), or the identity."""
        perm = self.env.perms[split]
        n = perm.shape[0]
        if self.config.shuffle:
            offset = epoch * Philox.blocks_needed(n, words_per_item=2)
            perm[:] = Philox(self.config.seed).permutation(n, int(StreamId.SHUFFLE), offset)
        else:
            perm[:] = np.arange(n)

    @property
    def gpu(self) -> Any:
        """The GPU executor when the step replays on a device, else None."""
        return None if self.replay is self.executor else cast(Any, self.replay)
