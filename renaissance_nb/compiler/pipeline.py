"""The task's three calls over the five stages, as pure functions of a TaskConfig.

    plan_stage(config)                    -> Planned   stages 1-2: ArchPlan, shapes of six variants, max slots
    lock_stage(config, planned)           -> Locked    stages 3-4: zero-shape graphs, then six MemoryPlans
    compile_stage(config, planned, locked) -> CompiledPlan  stage 5: the GraphAtlas (binding is the runner's)

Each returns a frozen value with ``as_text()`` and ``summary()`` (after JAX's Traced -> Lowered ->
Compiled); the widgets draw exactly these values. The checks of settings that only the data can
judge (channels-last images, class weights, batch norm on one value) run here, at plan().
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from ..config import PRECISIONS, TaskConfig
from ..data.arrays import looks_channels_last
from ..errors import ConfigError, bad_argument
from ..memory.dtensor import register_dtype
from ..memory.liveness import Lifetimes
from ..memory.plan import MemoryPlan
from ..text import bytes_versus, human_bytes, plural
from ..train.callbacks import lacking_field
from ..train.epochs import EpochBatches
from ..train.plateau import ReduceLROnPlateau
from ..ops.registry import op_of
from .autocast import G_RANGE, extend_tables, lock_graphs
from .emit import StepOptions
from .recompute import check_recompute
from .layers import ArchPlan, plan_architecture
from .stages import (AllShapes, CompiledPlan, Graphs, build_computation_graph, compute_max_slot_bytes,
                     create_memory_plans, derive_all_shapes, graph_lifetimes, share_or_clone, variant_specs)

MAX_STEPS = 2**26
"""The most training steps a task plans: its per-step learning-rate table and its per-step loss log
(float32 each, in the arena, and in a checkpoint) are then 256 MiB each. 67 million steps is
140,000 epochs of full MNIST at batch 128."""

NO_DATA = "plan: no data was set. Fix: task.data(datasets.default_mnist()) or task.data(train=(X, y))."


def learning_rates(config: TaskConfig) -> np.ndarray:
    """The learning rate of every step, read-only: the scheduler's table over ``config.base_lr`` (the
    optimizer's lr, or the scheduler's own base_lr), or that rate at every step without a scheduler."""
    spe, total = config.steps_per_epoch, config.total_steps
    if total > MAX_STEPS:
        raise bad_argument(ConfigError, "total_epochs", "epochs", config.total_epochs,
                           f"at most {MAX_STEPS // spe} epochs of {spe} steps: the step reads its learning rate "
                           f"from a float32 table of one value per step and logs its loss in another, and "
                           f"{total} steps would need {human_bytes(8 * total)}",
                           "train for fewer epochs, or with a larger batch size")
    opt, sched = config.optimizer, config.scheduler
    if sched is None:
        return _read_only(np.full(total, config.base_lr, np.float32))
    if sched.base_lr_ is not None and opt.lr_ not in (sched.base_lr_, type(opt)().lr_):
        raise ConfigError(f"plan: two learning rates: {type(opt).__name__}(lr={opt.lr_!r}) and "
                          f"{type(sched).__name__}(base_lr={sched.base_lr_!r}); the schedule would scale "
                          "base_lr and ignore the optimizer's. Fix: drop base_lr to schedule the optimizer's lr "
                          "(as PyTorch does), or set the same value in both.")
    return _read_only(sched.table(spe, config.total_epochs, config.base_lr))


def learning_rates_key(config: TaskConfig) -> tuple[Any, ...]:
    """What ``learning_rates`` reads (the two-rates check reads the optimizer's lr and its kind's default):
    a table kept for one key holds while the key is equal (task.lr_table caches it by this)."""
    return (config.scheduler, type(config.optimizer), config.optimizer.lr_, config.base_lr, config.steps_per_epoch,
            config.total_epochs)


def _read_only(table: np.ndarray) -> np.ndarray:
    table.flags.writeable = False
    return table


# ---- the stage values ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Planned:
    """plan(): stages 1-2. The layers after fusion, every variant's tensors, the slot sizes."""

    arch: ArchPlan
    shapes: AllShapes
    max_slot_bytes: tuple[int, ...]
    lr_table: np.ndarray = field(compare=False, repr=False)  # the learning rate of every step, read-only

    def summary(self) -> str:
        used = sum(s.used for s in self.shapes.specs.values())
        return (f"Planned: {plural(len(self.arch.layers), 'layer')}, {plural(len(self.max_slot_bytes), 'tensor')} "
                f"in {used} of {len(self.shapes.specs)} variants, {human_bytes(sum(self.max_slot_bytes))} of slots")

    def as_text(self) -> str:
        return f"{self.summary()}\n{self.arch!r}\n{self.shapes!r}"


@dataclass(frozen=True)
class Locked:
    """lock_memory(): stages 3-4. The zero-shape graphs and the six plans sharing one placement."""

    graphs: Graphs
    lifetimes: Lifetimes | None
    plans: dict[str, MemoryPlan]

    @property
    def memory(self) -> MemoryPlan:
        return self.plans["train_base"]

    def registered_graphs(self) -> dict[str, tuple[list[Any], Any]]:
        """The built graphs by GraphId, as TaskBase lists hand-registered ones: name -> (nodes, stream)."""
        g = self.graphs
        return {f"{kind}/{gid.name}": (graph.nodes(gid), gid.stream)
                for kind, graph in (("train", g.train), ("inference", g.inference)) for gid in graph.ids()}

    def summary(self) -> str:
        m = self.memory
        return (f"Locked: {len(self.graphs.train)}+{len(self.graphs.inference)} train+inference nodes, "
                f"arena {human_bytes(m.total_bytes)} over {plural(len(self.plans), 'variant plan')}")

    def as_text(self) -> str:
        return f"{self.summary()}\n{self.memory.summary()}\n{self.graphs!r}"


# ---- the stages ---------------------------------------------------------------------------------------
def _sample_checks(config: TaskConfig, arch: ArchPlan, sample: tuple[int, ...]) -> None:
    tokens = config.data is not None and config.data.train.is_tokens
    if config.train_resolution is not None and tokens:
        _check_train_context(config.train_resolution, sample[0])
    elif config.train_resolution is not None and len(sample) != 3:
        raise ConfigError(f"plan: train_resolution needs image data (N, C, H, W) or token windows; the samples are "
                          f"{sample}. Fix: load images with layout='image', or drop train_resolution().")
    if arch.reads_image_layout and config.channels_last is None and looks_channels_last(sample):
        c, h, w = sample
        raise ConfigError(f"plan: the training images are shaped {sample}, which looks like channels-last "
                          f"(H, W, C) = ({c}, {h}, {w}); the model reads (N, C, H, W) as PyTorch does, so it "
                          f"would see {c} channels of {h}x{w} images. Fix: task.data(..., channels_last=True) "
                          "converts them; task.data(..., channels_last=False) says they are (N, C, H, W).")
    if (config.crop_pad or config.flip) and len(sample) != 3:
        raise ConfigError(f"plan: augment(crop_pad={config.crop_pad}, flip={config.flip}) needs image data "
                          f"(N, C, H, W); the samples are {sample}. Fix: load images with layout='image', or "
                          "drop augment().")
    weights = config.loss.weight_
    classes = config.data.train.num_classes if config.data else 0
    if weights is not None and len(weights) != classes:
        raise ConfigError(f"plan: the loss has {len(weights)} class weights (CrossEntropyLoss(weight=...)); the "
                          f"data has {classes} classes. Fix: give one weight per class, in class order.")


def _check_train_context(res: Any, t: int) -> None:
    """A language model's progressive context: train_resolution(begin, end, epoch) reads begin and end as
    context lengths (the windows' first positions), each at most the windows' length."""
    (t0, w0), (t1, w1), _ = res
    for name, (a, b) in (("begin", (t0, w0)), ("end", (t1, w1))):
        if a != b or a > t:
            fix = (f"e.g. train_resolution({t // 2}, {t}, boundary_epoch=2): a short context first, the full one "
                   "after" if t > 1 else "drop train_resolution(): windows of one position cannot grow")
            raise ConfigError(f"plan: train_resolution's {name} for token windows is a context length of at most {t} "
                              f"(the windows'); got {(a, b) if a != b else a}. Fix: {fix}.")


def plan_stage(config: TaskConfig) -> Planned:
    """Stages 1-2 after the checks only the data can settle."""
    if config.model is None:
        raise ConfigError("plan: no model was set. Fix: task.model(seq(fc(128), relu(), fc(10))).")
    s = config.data
    if s is None:
        raise ConfigError(NO_DATA)
    if config.ranks > 1 and config.device == "cuda":
        raise ConfigError("plan: distributed('mpi') runs on the CPU; the GPU's all-reduce (NCCL) is not built yet. "
                          "Fix: device('cpu'), or train on one process.")
    _precision_checks(config)
    lr_table = learning_rates(config)  # also validates the schedule against the data (warmup longer than training)
    sched = config.scheduler
    if isinstance(sched, ReduceLROnPlateau) and sched.monitor_ not in config.record_fields():
        raise lacking_field(f"plan: {sched!r}", sched.monitor_)
    arch = plan_architecture(config.model, config.fuse, config.fold_bn)
    if config.recompute:
        check_recompute(arch)
    sample = tuple(s.train.sample_shape)
    _sample_checks(config, arch, sample)
    first = low = None
    if config.train_resolution is not None and s.train.is_tokens:  # progressive context: windows' first T'
        (t0, _), (t1, _), _ = config.train_resolution
        first, low = (t0,), (t1,)
    elif config.train_resolution is not None:
        (h0, w0), (h1, w1), _ = config.train_resolution
        first, low = (sample[0], h0, w0), (sample[0], h1, w1)
    specs = variant_specs(local_sizes(config), config.val_batches, sample, lowres_shape=low, train_shape=first)
    register_dtype(PRECISIONS[config.precision])  # the stages size bfloat16 tensors by NumPy's itemsize
    shapes = derive_all_shapes(arch, specs, s.train.num_classes, config.optimizer.state, config.total_steps,
                               ema=config.ema is not None, clip=config.clip_grad_norm is not None,
                               class_weights=config.loss.weight_ is not None, tokens=s.train.is_tokens,
                               recompute=config.recompute, lowp=PRECISIONS[config.precision],
                               scaling=config.precision == "fp16", elide=_elides_outputs(config))
    _check_batch_norm_values(config, arch, shapes)
    if config.precision != "fp32":  # the weights' copies and the casts' buffers, found on the graphs
        extend_tables(shapes, _graphs(config, arch, shapes.tables["train_base"]), str(PRECISIONS[config.precision]),
                      config.precision == "fp16", config.ema is not None, arch.output)
    return Planned(arch, shapes, tuple(compute_max_slot_bytes(shapes)), lr_table)


def _precision_checks(config: TaskConfig) -> None:
    """What mixed precision cannot combine with yet, refused before anything is planned."""
    if config.precision == "fp32":
        return
    if config.precision == "fp16" and not config.nan_check:
        raise ConfigError("plan: precision('fp16') scales the loss and skips a step whose gradients overflow, which "
                          "the NaN check finds; options(nan_check=False) turns it off. Fix: options(nan_check=True), "
                          "or precision('bf16'), which needs no loss scaling.")
    if config.ranks > 1:
        raise ConfigError(f"plan: precision({config.precision!r}) on {config.ranks} ranks: the all-reduce of the "
                          "low-precision weight gradients is not built yet. Fix: precision('fp32') for data-parallel "
                          "training, or train on one process.")


def local_sizes(config: TaskConfig) -> EpochBatches:
    """One rank's training batches: every global batch, the last partial one too, is split into equal
    contiguous shards, so a rank's plan is the same on every rank and the mean of the ranks' mean
    gradients is the global batch's mean gradient."""
    assert config.data is not None
    epoch, ranks = config.train_batches, config.ranks
    if epoch.splits_over(ranks):
        return epoch.shard(ranks)
    n, batch = epoch.n, epoch.batch
    why = ("every rank takes an equal contiguous shard of each global batch, so that the ranks' plans are alike "
           "and the averaged gradient is the global batch's")
    if n % ranks:  # n = q * batch + last: were batch and last multiples of ranks, n would be one too
        raise ConfigError(f"plan: {n} training samples do not split evenly over {ranks} ranks with any batch size "
                          f"({n} = {n // batch} x {batch} + {epoch.remainder}): {why}, the last batch's too. Fix: "
                          f"train on a multiple of {ranks} samples (drop {n % ranks}), or another number of ranks.")
    raise ConfigError(f"plan: batch_size={batch} does not split evenly over {ranks} ranks: {why}. Fix: a batch_size "
                      f"that is a multiple of {ranks} (its last batch then is one too), e.g. "
                      f"{_fitting_batch(n, batch, ranks)}, or another number of ranks.")


def _fitting_batch(n: int, batch: int, ranks: int) -> int:
    """The batch size nearest ``batch`` whose batches, the last one too, split over ``ranks`` (there is
    one, ``ranks`` itself, when ``n`` is a multiple of ``ranks``)."""
    for d in range(0, batch):
        for b in (batch - d, batch + d):
            if b >= ranks and EpochBatches(n, b).splits_over(ranks):
                return b
    return ranks


def _check_batch_norm_values(config: TaskConfig, arch: ArchPlan, shapes: AllShapes) -> None:
    """Batch norm in training needs more than one value per channel in every batch, as in PyTorch
    (one value normalises to 0 and passes no gradient): a training batch of one sample is
    refused where a BN sees no spatial extent (after fc or gap, or at 1x1 maps)."""
    bns = {layer.name for layer in arch.layers if op_of(layer.kind).batch_statistics}
    trains: tuple[str, ...] = ("train_base", "train_last", "train_lowres", "train_lowres_last")
    batch, res = config.batch_size, config.train_resolution
    if res is not None:  # epochs before the boundary train at the first size, the rest at the second
        trains = trains[:2] * (res[2] > 0) + trains[2:] * (res[2] < config.total_epochs)
    for v in trains:
        spec = shapes.specs[v]
        if not spec.used or spec.batch > 1:
            continue
        for name, x, _ in shapes.tables[v].layer_shapes:
            if name in bns and math.prod(x[:-1]) == 1:
                if config.ranks > 1:  # spec.batch is one rank's share of the step
                    part = "every" if v in ("train_base", "train_lowres") else "the last"
                    where = f"with batch_size={batch} on {config.ranks} ranks, each rank gets 1 sample of {part} step and"
                    fix = (f"a batch size of at least {2 * config.ranks} whose last batch also gives every rank 2 "
                           "samples or more, or fewer ranks")
                elif spec.batch == batch:
                    where, fix = f"with batch_size={batch},", "a batch size above 1"
                else:
                    n = len(config.data.train) if config.data else 0
                    where = (f"batch_size={batch} leaves a last training batch of 1 sample ({n} samples), where")
                    fix = "a batch size that does not divide len(train) - 1, or drop one training sample"
                size = "" if res is None else f" at the training size {spec.input_shape[-2:]}"
                raise ConfigError(f"plan: {where} {name} would see one value per channel{size}: batch norm "
                                  f"needs more than one in training (as in PyTorch). Fix: {fix}.")


def step_options(config: TaskConfig) -> StepOptions:
    """What the emitted graphs depend on besides the layers."""
    assert config.data is not None  # plan_stage checked it
    return StepOptions(config.loss.label_smoothing_, tuple(sorted(config.optimizer.graph_params().items())),
                       zero_grad=config.zero_grad, nan_check=config.nan_check, nan_policy=config.nan_policy,
                       ema_decay=config.ema, clip_norm=config.clip_grad_norm,
                       image=len(config.data.train.sample_shape) == 3,
                       crop_pad=config.crop_pad, flip=config.flip, prefetch=config.prefetch, ranks=config.ranks,
                       allreduce=config.allreduce, recompute=config.recompute)


def _elides_outputs(config: TaskConfig) -> bool:
    """StepOptions.elide_outputs: off under mixed precision (16-bit outputs, rounded before a pool reads them)
    and with liveness=False (every temporary kept to read)."""
    return config.precision == "fp32" and config.liveness


def _graphs(config: TaskConfig, arch: ArchPlan, table: Any) -> Graphs:
    """Stage 3's graphs over ``table``'s ids (fp16: a NaN check that skips, as GradScaler's step does)."""
    opts = step_options(config)
    if not _elides_outputs(config):
        opts = replace(opts, elide_outputs=False)
    if config.precision == "fp16":
        opts = replace(opts, nan_policy="skip")
    if dict(opts.optimizer).get("decay") == "matrices":
        opts = replace(opts, optimizer=opts.optimizer + (("decay_from", first_decayed(arch, table)),))
    return build_computation_graph(arch, table.ids, opts, G_RANGE)


def lock_stage(config: TaskConfig, planned: Planned) -> Locked:
    """Stage 3 (graphs: they need only tensor ids) before stage 4 (placement, which packs by their liveness)."""
    table = planned.shapes.tables["train_base"]
    graphs = _graphs(config, planned.arch, table)
    if config.precision != "fp32":
        train, inference = lock_graphs(graphs, table, str(PRECISIONS[config.precision]), config.precision == "fp16",
                                       config.ema is not None, planned.arch.output)
        graphs = Graphs(train, inference)
    opts_decay = dict(step_options(config).optimizer).get("decay") == "matrices"
    lifetimes = graph_lifetimes(graphs) if config.liveness else None
    plans = create_memory_plans(planned.shapes, list(planned.max_slot_bytes), lifetimes, config.pad_rows,
                                dict(planned.arch.merged))
    if opts_decay:
        _check_decay_prefix(plans["train_base"], planned.arch, first_decayed(planned.arch, table))
    return Locked(graphs, lifetimes, plans)


MATRIX_REGIONS = ("W_FC_WEIGHT", "W_FIRST_CONV", "W_DEEP_CONV")


def first_decayed(arch: ArchPlan, table: Any) -> str:
    """The first weight (in address order: the W regions' order, then table order) that weight decay
    reaches under decay="matrices": norms (BN regions) and biases (FC_BIAS) lie before the matrix
    regions, embeddings (the first layers) first inside them. The update decays from it on."""
    kinds = {layer.name: layer.kind for layer in arch.layers}
    for spec in table.specs:
        if spec.region.name in MATRIX_REGIONS and not op_of(kinds[spec.name.split(".")[0]]).decay_exempt:
            return spec.name
    raise ConfigError("optimizer: decay='matrices' but the model has no weight matrix to decay. Fix: decay='all', "
                      "or weight_decay=0.")


def _check_decay_prefix(plan: MemoryPlan, arch: ArchPlan, first: str) -> None:
    """Invariant of decay="matrices": the W tensors before ``first`` are the exempt ones (norms, biases,
    embeddings), those from it on the decayed matrices: the update splits the W range at its offset."""
    kinds = {layer.name: layer.kind for layer in arch.layers}
    cut = next(t.offset for t in plan if t.name == first)
    for t in plan:
        if t.region.family == "W":
            decayed = t.region.name in MATRIX_REGIONS and not op_of(kinds[t.name.split(".")[0]]).decay_exempt
            assert decayed == (t.offset >= cut), f"{t.name} at {t.offset} against the cut at {cut}"


def _plan_notes(config: TaskConfig, memory: MemoryPlan, graphs: Graphs) -> list[str]:
    notes = []
    if config.precision != "fp32":
        half = [t for t in memory if t.dtype in ("bfloat16", "float16")]
        casts = sum(n.op == "cast" for _, n in graphs.train)
        scaling = (" fp16: loss scaling as torch.amp.GradScaler (2^16, x2 per 2,000 clean steps, x0.5 and the step "
                   "skipped on an overflow) in CAST_AND_CHECK." if config.precision == "fp16" else "")
        notes.append(f"mixed precision {config.precision}: {plural(len(half), 'tensor')} stored in "
                     f"{PRECISIONS[config.precision]} ({human_bytes(sum(t.storage_bytes for t in half))}), "
                     f"{plural(casts, 'cast node')} in the training graph; fc products read their 16-bit operands "
                     "(fc_fwd_lowp, fc_bwd_lowp: fp32 sums, one rounding), other nodes read theirs widened into "
                     "planned fp32 buffers (products of 16-bit floats are exact in fp32), the weights' working "
                     f"copies are rounded from the fp32 masters before each step (CAST_MAIN_FP32_TO_FP16).{scaling}")
    if not config.zero_grad:
        notes.append("ZERO_GRAD elided: every gradient is written exactly once per step (the GEMM "
                     "overwrites it), so zeroing the G range would be a wasted pass; "
                     "options(zero_grad=True) puts it back.")
    padded = [t for t in memory if t.pitch is not None and t.region.family == "W"]
    if padded:
        rows = ", ".join(f"{t.name} {t.shape[1]} -> {t.pitch}" for t in padded)
        notes.append(f"padded rows: {rows} floats per row, and alike in their gradient, moment and EMA "
                     "copies (rows a multiple of 4 KiB apart alias in the cache and slow the matrix "
                     "products); options(pad_rows=False) stores them contiguous.")
    pooled = [(n.layer, n.p["relu_grad"]) for _, n in graphs.train if n.op == "bn_bwd" and n.p.get("dy_pool")]
    if pooled:
        pairs = ", ".join(f"{b} <- {m}" for b, m in dict.fromkeys(pooled[::-1]))  # in layer order
        notes.append(f"batch norms making their max pool's input gradient (ops/pool.py grad_from_pool): {pairs}; no "
                     "maxpool_bwd node and no dy tensor for them (the pool also makes their relu output in training).")
    if config.liveness:
        notes.append("liveness reuse: F/T tensors whose lifetimes never meet share bytes: arena "
                     f"{bytes_versus(memory.total_bytes, memory.bytes_without_reuse, 'without reuse')}.")
    return notes


def compile_stage(config: TaskConfig, planned: Planned, locked: Locked) -> CompiledPlan:
    """Stage 5: the atlas (which (graph, GraphId, ShapeId) triples are bound, shared where shapes agree)."""
    specs, table = planned.shapes.specs, planned.shapes.tables["train_base"]
    atlas = share_or_clone(specs, locked.graphs, locked.plans, config.zero_grad, config.nan_check)
    return CompiledPlan(planned.arch, planned.shapes, planned.max_slot_bytes, locked.memory.lifetimes,
                        locked.plans, locked.graphs, atlas, table.ids, table.params,
                        tuple(_plan_notes(config, locked.memory, locked.graphs)))


def describe_task(name: str, phase: Any, planned: Planned | None, locked: Locked | None, compiled: Any,
                  runner: Any) -> str:
    """task.summary(): the phase, then each stage's value as far as the task has come."""
    lines = [f"{name}: phase {phase}"]
    if planned is not None:
        lines.append(repr(planned.arch))
    if locked is not None:
        lines.append(locked.memory.summary())
    if compiled is not None:
        lines += describe_compiled(compiled, runner.notes if runner is not None else ())
    return "\n".join(lines)


def describe_compiled(compiled: Any, bound_notes: Sequence[str] = ()) -> list[str]:
    """The atlas lines of a task summary, then the plan's notes and ``bound_notes``, what binding it
    found (the Runner's: the device, the kernels chosen)."""
    a = compiled.atlas
    lines = [f"atlas: {len(a.entries)} entries over {len(a.variants)} variants -> "
             f"{len(a.captures)} distinct bound graphs; ShapeIds "
             + ", ".join(f"s{k}={'any' if v is None else v}" for k, v in a.shape_ids.items())]
    if a.collapsed:
        lines.append("variants collapsed: " + ", ".join(f"{k} -> {v}" for k, v in a.collapsed.items()))
    return lines + [f"note: {n}" for n in (*compiled.notes, *bound_notes)]
