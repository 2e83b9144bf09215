"""Inference on any data, and the parameters as PyTorch state dicts.

The inference graph (INF_MAIN_A, or INF_EMA_A for the EMA weights) replays over x in batches of the
validation batch size, a partial batch padded; the input buffer and the last result are training
state between two steps, so they are put back afterwards. State dicts use PyTorch's names and
layouts ('fc1.weight' is (out, in), 'conv1.weight' (out, in, k, k)).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from ..checks import as_flag
from ..compiler.ids import GraphId
from ..config import TaskConfig
from ..data.arrays import Dataset, moved_to_channels_first, validate_arrays
from ..errors import CheckpointError, ConfigError, DataError, bad_argument
from ..kernels import blas, fused, native
from ..memory.dtensor import arena_layout, torch_layout
from .runner import Runner
from .trainer import RunState

Batches = Iterator[tuple[int, int, np.ndarray]]


class Inference:
    """evaluate/predict and state dicts over one compiled task's runner."""

    def __init__(self, config: TaskConfig, runner: Runner, state: RunState) -> None:
        assert config.data is not None  # compiled tasks have data
        self.config, self.runner, self.state, self.data = config, runner, state, config.data

    # ---- the forward pass over any data ---------------------------------------------------------------
    def _forward_batches(self, x: np.ndarray, y: np.ndarray | None, ema: bool = False) -> Batches:
        """(start, n, logits) per batch of x through INF_MAIN_A (INF_EMA_A with ``ema``)."""
        runner, rx, ex = self.runner, self.runner.replay, self.runner.executor
        compiled = runner.compiled
        variant = "val_base"
        data, labels = ex.view(variant, "I_A.data"), ex.view(variant, "I_A.label")
        logits = ex.view(variant, f"{compiled.arch.layers[-1].name}.out")
        prog = list(ex.kernels(variant, GraphId.INF_EMA_A if ema else GraphId.INF_MAIN_A))
        if self.config.prefetch and data.ndim == 4:
            prog = prog[1:]  # no transfer was submitted: skip the transfer_wait that heads the graph
        runner.fold_bn(ex)
        bsz, image = data.shape[0], data.ndim == 4
        # Between two steps the input buffer holds the next training batch (prefetched) and R_RESULT
        # the last step's loss: both are training state, put back afterwards.
        runner.drain_transfers()
        if self.state.live_at is not None:
            rx.download_all()  # called from a step callback on a device: its weights are current
        keep = [(v, v.copy()) for v in (data, labels, ex.view(variant, "result"))]
        try:
            for start in range(0, len(x), bsz):
                n = min(bsz, len(x) - start)
                chunk = x[start:start + n]
                data[:n] = chunk.transpose(0, 2, 3, 1) if image else chunk.reshape((n, *data.shape[1:]))
                data[n:] = 0
                labels[:n] = 0 if y is None else y[start:start + n]
                labels[n:] = 0
                with blas.own_cores():
                    for k in prog:
                        k()
                yield start, n, logits[:n] if logits.dtype == np.float32 else logits[:n].astype(np.float32)
        finally:
            for view, saved in keep:
                view[...] = saved

    def evaluate(self, x: Any, y: Any, ema: Any) -> dict[str, float]:
        ema = self._ema_flag("evaluate", ema)
        if self.data.train.is_tokens:
            return self._evaluate_tokens(x, y, ema)
        ds = self._inputs_as_trained("evaluate", validate_arrays(
            x, y, what="evaluate", num_classes=self.data.train.num_classes, where="evaluate", names=("x", "y")))
        sums = np.zeros(3)
        res = np.zeros(3, np.float32)
        loss = self.config.loss
        none = np.zeros((0, 0), np.float32)
        for start, n, logits in self._forward_batches(ds.x, ds.y, ema):
            args = (logits, ds.y[start:start + n], float(loss.label_smoothing_), loss.class_weights, res, none, False)
            (native.bind_softmax_xent(*args) or (lambda: fused.softmax_xent(*args)))()
            sums += (res[0] * n, res[1], res[2])
        n = len(ds)
        return {"loss": sums[0] / n, "top1": sums[1] / n, "top5": sums[2] / n, "n": n}

    def _evaluate_tokens(self, x: Any, y: Any, ema: bool) -> dict[str, float]:
        """A language model's loss per token (and perplexity), next-token top-1/top-5, over windows x
        with their targets y (both (N, T))."""
        ids, targets = self._token_windows("evaluate", "x", x), self._token_windows("evaluate", "y", y)
        if targets.shape != ids.shape:
            raise bad_argument(DataError, "evaluate", "y", y, f"targets shaped like x {ids.shape}",
                               "pass each window's next tokens (data.val.y for data.val.x)")
        sums, res, none = np.zeros(3), np.zeros(3, np.float32), np.zeros((0, 0), np.float32)
        weights, positions = self.config.loss.class_weights, ids.shape[1]
        for start, n, logits in self._forward_batches(ids, targets, ema):
            rows, labels = logits.reshape(-1, logits.shape[-1]), targets[start:start + n].reshape(-1)
            args = (rows, labels, float(self.config.loss.label_smoothing_), weights, res, none, False)
            (native.bind_softmax_xent(*args) or (lambda: fused.softmax_xent(*args)))()
            sums += (res[0] * n, res[1] / positions, res[2] / positions)
        n = len(ids)
        return {"loss": sums[0] / n, "perplexity": float(np.exp(sums[0] / n)), "top1": sums[1] / n,
                "top5": sums[2] / n, "n": n}

    def predict(self, x: Any, ema: Any) -> np.ndarray:
        count, batches = self._inference("predict", x, ema)
        out = np.empty((count, *self.data.train.sample_shape[:1]) if self.data.train.is_tokens else count, np.int64)
        for start, n, logits in batches:
            out[start:start + n] = logits.argmax(axis=-1)
        return out

    def gathered(self, op: str, x: Any, f: Callable[[np.ndarray], np.ndarray], ema: Any) -> np.ndarray:
        """f(logits) of every row of x, (N, classes) float32 ((N, T, vocab) for a language model)."""
        count, batches = self._inference(op, x, ema)
        positions = self.data.train.sample_shape[:1] if self.data.train.is_tokens else ()
        out = np.empty((count, *positions, self.data.train.num_classes), np.float32)
        for start, n, logits in batches:
            out[start:start + n] = f(logits)
        return out

    def _inference(self, op: str, x: Any, ema: Any) -> tuple[int, Batches]:
        """The rows of x, checked and moved as evaluate() does, and (start, n, logits) per batch."""
        ema = self._ema_flag(op, ema)
        if self.data.train.is_tokens:
            ids = self._token_windows(op, "x", x)
            return len(ids), self._forward_batches(ids, None, ema)
        try:  # without converting x: validate_arrays turns a ragged or odd input into the library's error
            rows = len(x)
        except TypeError:  # a 0-d array or a scalar: validate_arrays refuses it by name
            rows = 0
        ds = self._inputs_as_trained(op, validate_arrays(x, np.zeros(rows, np.int64), what=op, where=op,
                                                         names=("x", "y")))
        return len(ds), self._forward_batches(ds.x, None, ema)

    def _token_windows(self, op: str, arg: str, x: Any) -> np.ndarray:
        """Token windows (N, T) of ids in [0, vocab), T as in training: a language model's input."""
        vocab, t = self.data.train.num_classes, self.data.train.sample_shape[0]
        a = np.asarray(x)
        if a.ndim == 1:
            a = a.reshape(1, -1)
        if a.dtype.kind not in "iu" or a.ndim != 2 or a.shape[1] != t or a.size == 0:
            raise bad_argument(DataError, op, arg, x, f"token ids shaped (N, {t}) like the training windows",
                               f"pass windows of {t} ids (tokenizer.encode(text)), e.g. data.val.x[:4]")
        if int(a.min()) < 0 or int(a.max()) >= vocab:
            raise bad_argument(DataError, op, arg, x, f"ids in [0, {vocab})", "encode with the data's tokenizer")
        return np.ascontiguousarray(a, np.int32)

    def _ema_flag(self, op: str, ema: Any) -> bool:
        """``ema=`` of the inference calls: a bool, and True only for a task compiled with ``ema()``."""
        ema = as_flag(ema, op, "ema", ConfigError, f"pass task.{op}(..., ema=True)")
        if ema and self.config.ema is None:
            raise ConfigError(f"{op}: ema=True, but this task keeps no EMA weights. Fix: call task.ema(0.999) "
                              "before compile() and train, or drop ema=True.")
        return bool(ema)

    def _inputs_as_trained(self, op: str, ds: Dataset) -> Dataset:
        """``ds`` in the layout the model was trained on: for a task given channels-last images, arrays
        shaped (N, H, W, C) are moved as data() moved them (those already (N, C, H, W), such as
        ``task.splits``' own, are taken as they are, unless C == H == W says nothing); any other shape
        than training's is refused."""
        c, h, w = (self.data.train.sample_shape + (0, 0, 0))[:3]
        if self.config.channels_last and ds.x.shape[1:] == (h, w, c):  # C == H == W: moved, as data() moved them
            ds = moved_to_channels_first(ds)
        self._check_sample_shape(op, ds.x)
        return ds

    def _check_sample_shape(self, op: str, x: np.ndarray) -> None:
        want = tuple(self.data.train.sample_shape)
        got = tuple(x.shape[1:])
        if got == want:
            return
        if len(want) == 3 and self.config.channels_last:
            c, h, w = want
            raise bad_argument(DataError, op, "x", x, f"images shaped (N, {h}, {w}, {c}) as given to data() with "
                               f"channels_last=True, or (N, {c}, {h}, {w})", "pass images of the training size")
        if len(want) == 3:  # image models read (N, C, H, W) as such: a flat or channels-last batch is not it
            raise bad_argument(DataError, op, "x", x, f"images shaped (N, {', '.join(map(str, want))}) as in "
                               "training (N, C, H, W)", f"reshape it, e.g. X.reshape(-1, {', '.join(map(str, want))})"
                               " for flat rows, or X.transpose(0, 3, 1, 2) for channels-last images")
        fix = (f"reshape it as training's, x.reshape(-1, {', '.join(map(str, want))})"
               if int(np.prod(got)) == int(np.prod(want)) else "pass data shaped like the training data")
        raise bad_argument(DataError, op, "x", x, f"samples of shape {want} like the training data (as data() "
                           "takes them)", fix)

    # ---- parameters -----------------------------------------------------------------------------------
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """State-dict names and PyTorch shapes (conv weights (out, in, k, k))."""
        out = {}
        for p in self.runner.compiled.params:
            shape = p.shape
            if len(shape) == 4:
                shape = (shape[0], shape[3], shape[1], shape[2])
            out[p.name] = shape
        return out

    def state_dict(self, ema: Any) -> dict[str, np.ndarray]:
        ema = self._ema_flag("state_dict", ema)
        return {p.name: torch_layout(self.runner.view(p.name + ("@ema" if ema else ""))).copy()
                for p in self.runner.compiled.params}

    def load_state_dict(self, state: Any) -> None:
        """Every key and shape checked before anything is written; the EMA copies start from them too."""
        expected = self.param_shapes()
        if not isinstance(state, dict):
            raise bad_argument(CheckpointError, "load_state_dict", "state", state, "a dict name -> array",
                               "pass the dict from task.state_dict()")
        missing = sorted(set(expected) - set(state))
        extra = sorted(set(state) - set(expected), key=str)  # a key of another type is unexpected too
        if missing or extra:
            raise CheckpointError(f"load_state_dict: keys differ: missing {missing}, unexpected {extra}. "
                                  "Fix: load a state dict made for this model.")
        arrays = {k: _checked_param(k, state[k], shape) for k, shape in expected.items()}
        for k, a in arrays.items():
            self.runner.view(k)[...] = a
            if self.config.ema is not None:
                self.runner.view(f"{k}@ema")[...] = a


def _checked_param(k: str, value: Any, shape: tuple[int, ...]) -> np.ndarray:
    """One state-dict entry as the arena stores it, or the CheckpointError that says why it cannot be."""
    try:
        source = np.asarray(value)
        if source.dtype.kind not in "iuf":
            raise TypeError(source.dtype)
        with np.errstate(over="ignore"):
            a = source.astype(np.float32)
    except (TypeError, ValueError):
        raise bad_argument(CheckpointError, "load_state_dict", k, value, f"a real-valued array of shape {shape}",
                           "load a state dict made for this model (task.state_dict())") from None
    if a.shape != shape:
        raise CheckpointError(f"load_state_dict: {k} has shape {a.shape}, the model needs {shape}. "
                              "Fix: load a state dict made for this model.")
    if not np.isfinite(a).all():
        why = ("values beyond float32's range (|x| > 3.4e38), which the weights are stored in"
               if np.isfinite(source).all() else "non-finite values")
        raise CheckpointError(f"load_state_dict: {k} holds {why}. Fix: check the source.")
    return arena_layout(a)
