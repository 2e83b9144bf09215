"""Checkpoints: the state of a compiled DeepLearningTask in one ``.npz`` file.

Format
------
One ``.npz`` archive written with ``np.savez`` (no pickle anywhere):

* ``region_<X>`` uint8 arrays: the raw arena bytes of every range that carries
  state from one step to the next: weights (W), optimizer moments (M, V),
  batch-norm statistics (B) and EMA weights (E) where present, the input buffers
  (I_A/I_B: at a step boundary the *other* buffer already holds the prefetched
  next batch), the scalars and masks (S: step counter, data cursor, RNG offset,
  NaN flag, lr table, dropout masks), the last batch's result (R_RESULT) and the
  accumulated metrics and loss log (R_RESULT_ACCUMULATED).
* ``perm_<split>`` int64 arrays: the sample permutation of each split (the
  current epoch's shuffle, needed to resume in the middle of an epoch).
* ``header.json``: a uint8 array holding UTF-8 JSON: format version, the plan
  fingerprint (BluePrint repr, name/shape/dtype/region/offset of every tensor of
  the train_base plan, total arena bytes, the byte range of each saved region),
  seed, settings reprs, the task's spec (to rebuild it), epoch, resume position,
  history, ReduceLROnPlateau's state, and a SHA-256 over the array bytes in a
  fixed (sorted key) order.

Why npz + JSON: the file is inspectable with NumPy alone
(``np.load(path)["region_W"]``, ``json.loads(bytes(np.load(path)["header.json"]))``),
it never needs ``allow_pickle`` (loading cannot execute code), it is one file
that can be copied or attached as is, and the zip container gives a CRC per
member on top of our own SHA-256. Bytes rather than per-tensor arrays keep the
save/load a handful of memcpys and make "restored exactly" a byte comparison.

Writes are atomic: a temporary file in the same folder, flushed and fsynced,
then ``os.replace``; a crash mid-save leaves the previous checkpoint intact.
Loading validates everything before it writes a single byte, so a failed load
leaves the task byte-for-byte unchanged.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from typing import Any

import numpy as np

from .checks import as_flag
from .errors import CheckpointError
from .files import with_default_mode
from .memory.dtensor import DTensor, tensor_view, torch_layout
from .memory.region import Region
from .result import EpochRecord
from .task import Phase

FORMAT = "renaissance_nb.checkpoint"
VERSION = 1
HEADER_KEY = "header.json"

# (array key, first region, last region): contiguous region ranges carrying state.
STATE_RANGES: tuple[tuple[str, Region, Region], ...] = (
    ("B", Region.B_PREV_MEAN, Region.B_NEXT_VAR),
    ("W", Region.W_EQ_BIAS, Region.W_DEEP_CONV),
    ("E", Region.E_BN_BIAS, Region.E_DEEP_CONV_FP16),
    ("R_RESULT", Region.R_RESULT, Region.R_RESULT),
    ("M", Region.M_BN_BIAS, Region.M_DEEP_CONV),
    ("V", Region.V_BN_BIAS, Region.V_DEEP_CONV),
    ("I", Region.I_A_LABEL, Region.I_B_DATA),
    ("S", Region.S_SCALAR_FP32, Region.S_MASK),
    ("R_RESULT_ACCUMULATED", Region.R_RESULT_ACCUMULATED, Region.R_RESULT_ACCUMULATED),
)

__all__ = ["save", "load_state", "read_header", "read_state_dict", "fingerprint", "FORMAT", "VERSION"]


# ---- helpers ---------------------------------------------------------------------------------
def _require_compiled(task: Any, op: str) -> None:
    from .deep_task import DeepLearningTask

    if not isinstance(task, DeepLearningTask):
        raise CheckpointError(f"{op}: task={type(task).__name__} is invalid; expected a DeepLearningTask. "
                              "Fix: pass the DeepLearningTask to save or restore.")
    task._require(op, Phase.COMPILED, hint="Fix: call task.compile() first (build the task the same way "
                                            "as the one that was saved).")


def fingerprint(task: Any) -> dict[str, Any]:
    """What must match between the saved task and the one restored into."""
    plan = task.plans["train_base"]
    tensors = [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "region": t.region.name,
                "offset": int(t.offset), **({"pitch": t.pitch} if t.pitch is not None else {})} for t in plan]
    ranges = {key: list(task.memory.region_range(a, b)) for key, a, b in STATE_RANGES}
    return {"blueprint": repr(task._model), "tensors": tensors, "total_bytes": int(plan.total_bytes),
            "ranges": ranges}


def _setting_spec(obj: Any) -> dict[str, Any] | None:
    if obj is None:
        return None
    return {"class": type(obj).__name__, "settings": {k: (list(v) if isinstance(v, tuple) else v)
                                                     for k, v in obj.settings().items()}}


def spec(task: Any) -> dict[str, Any]:
    """Everything needed to rebuild the task around new data: model and settings, structured."""
    return {"blueprint": task._model.to_dict(), "loss": _setting_spec(task._loss),
            "optimizer": _setting_spec(task._optimizer), "scheduler": _setting_spec(task._scheduler),
            "total_epochs": task._epochs, "seed": task._seed, "batch_size": task._batch,
            "val_batch_size": task._val_batch, "shuffle": task._shuffle, "channels_last": task._channels_last,
            "sample_shape": list(task._splits.train.sample_shape), "val_fraction": task._val_fraction,
            "name": task.name,
            "options": {"fuse": task._fuse, "liveness": task._liveness, "nan_check": task._nan_check,
                        "nan_policy": task._nan_policy, "zero_grad": task._zero_grad, "pad_rows": task._pad_rows},
            "autosave": {"every": None if task._save_every is None else list(task._save_every),
                         "best": task._save_best,
                         "best_by": None if task._save_best_by is None else list(task._save_best_by)},
            **_training_extras(task)}


def _training_extras(task: Any) -> dict[str, Any]:
    """EMA, gradient clipping, progressive resizing and augmentation: settings that change what training
    does (JSON-ready; a checkpoint saved before they were recorded holds none of them: they were off)."""
    r = task._resolution
    return {"ema": task._ema, "clip_grad_norm": task._clip_norm,
            "train_resolution": None if r is None else [list(r[0]), list(r[1]), r[2]],
            "augment": {"crop_pad": task._crop_pad, "flip": task._flip}}


EXTRAS_OFF = {"ema": None, "clip_grad_norm": None, "train_resolution": None,
              "augment": {"crop_pad": 0, "flip": False}}


def _settings(task: Any) -> dict[str, Any]:
    return {"seed": task._seed, "optimizer": repr(task._optimizer), "loss": repr(task._loss),
            "scheduler": repr(task._scheduler), "total_epochs": task._epochs, "batch_size": task._batch,
            "val_batch_size": task._val_batch, "shuffle": task._shuffle, "n_train": len(task._splits.train),
            "n_val": 0 if task._splits.val is None else len(task._splits.val), **_training_extras(task)}


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}|{a.dtype.str}|{a.shape}\n".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _state_arrays(task: Any) -> dict[str, np.ndarray]:
    buf = task._arena.bytes
    out = {}
    for key, first, last in STATE_RANGES:
        a, b = task.memory.region_range(first, last)
        out[f"region_{key}"] = buf[a:b].copy()
    for split, perm in sorted(task._env.perms.items()):
        out[f"perm_{split}"] = np.asarray(perm, dtype=np.int64).copy()
    return out


# ---- save ------------------------------------------------------------------------------------
def save(task: Any, path: str | os.PathLike) -> str:
    """Write the state of a compiled task to ``path`` atomically; returns the path."""
    _require_compiled(task, "save")
    given = path
    try:
        path = os.fspath(path)
    except TypeError:
        path = None
    if not isinstance(path, str) or not path or os.path.isdir(path):
        raise CheckpointError(f"save: path={given!r} is invalid; expected a file name (not a folder). "
                              "Fix: pass e.g. 'run.npz'.")
    arrays = _state_arrays(task)
    at = task._resume_at or task._live_at  # mid-epoch: after a stop, or from a step callback inside run()
    header = {
        "format": FORMAT, "version": VERSION,
        "fingerprint": fingerprint(task),
        "settings": _settings(task),
        "spec": spec(task),
        "epoch": int(task._epoch),
        "resume_at": None if at is None else [int(v) for v in at],
        "resume_seconds": task._seconds_into_epoch(),
        "history": [dict(r.__dict__) for r in task.result.history],
        "interrupted": bool(task.result.interrupted),
        "plateau": task._plateau,  # ReduceLROnPlateau's state; its lowered rates are in the table (region S)
        "sha256": _digest(arrays),
    }
    blob = np.frombuffer(json.dumps(header, sort_keys=True).encode("utf-8"), np.uint8)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CheckpointError(f"save: the folder {folder!r} of path {path!r} does not exist. "
                              "Fix: create it first (os.makedirs) or save elsewhere.")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise CheckpointError(f"save: cannot write in the folder {folder!r} of path {path!r} ({exc.strerror}). "
                              "Fix: save to a folder you can write to.") from None
    try:
        with_default_mode(tmp)  # mkstemp's file is owner-only; a checkpoint is a file like any other
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays, **{HEADER_KEY: blob})
            f.flush()
            os.fsync(f.fileno())
        try:
            os.replace(tmp, path)
        except (OSError, ValueError) as exc:  # a name the file system refuses ("embedded null byte", too long...)
            raise CheckpointError(f"save: cannot write {path!r} ({getattr(exc, 'strerror', None) or exc}). "
                                  "Fix: save under another name.") from None
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable (POSIX); harmless where unsupported
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return path


# ---- load ------------------------------------------------------------------------------------
def _read(path: str | os.PathLike, op: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Header and arrays of a checkpoint file, fully validated for integrity."""
    try:
        p = os.fspath(path)
    except TypeError:
        raise CheckpointError(f"{op}: path={path!r} is invalid; expected a file name. "
                              "Fix: pass the path given to checkpoint.save().") from None
    if not os.path.isfile(p):
        raise CheckpointError(f"{op}: no checkpoint file at {p!r}. "
                              "Fix: check the path; save one with task.save(path).")
    try:
        with open(p, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise CheckpointError(f"{op}: cannot read {p!r}: {exc}. Fix: check the file's permissions.") from None
    try:  # any failure of a damaged archive (zip flags, npy headers...) is this one error
        z = np.load(io.BytesIO(raw), allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise CheckpointError(f"{op}: {p!r} holds a single array (.npy), not a checkpoint (.npz archive). "
                                  "Fix: pass a file written by task.save(path).")
        with z:
            arrays = {k: z[k] for k in z.files}
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001
        why = ("it is not an .npz archive" if "pickle" in str(exc)  # numpy's text suggests allow_pickle
               else f"{type(exc).__name__}: {exc}")
        raise CheckpointError(f"{op}: {p!r} is corrupt or truncated, or not a checkpoint ({why}). "
                              "Fix: restore from another checkpoint; this file cannot be read.") from None
    if HEADER_KEY not in arrays:
        raise CheckpointError(f"{op}: {p!r} has no {HEADER_KEY} entry; it is not a renaissance_nb checkpoint. "
                              "Fix: pass a file written by checkpoint.save().")
    try:
        header = json.loads(arrays.pop(HEADER_KEY).tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{op}: the header of {p!r} is not valid JSON ({exc}). "
                              "Fix: restore from another checkpoint.") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(f"{op}: {p!r} is not a renaissance_nb checkpoint (format "
                              f"{header.get('format') if isinstance(header, dict) else None!r}). "
                              "Fix: pass a file written by checkpoint.save().")
    if header.get("version") != VERSION:
        raise CheckpointError(f"{op}: {p!r} has format version {header.get('version')!r}; this library reads "
                              f"version {VERSION}. Fix: load it with the renaissance_nb version that wrote it.")
    digest = _digest(arrays)
    if digest != header.get("sha256"):
        raise CheckpointError(f"{op}: checksum mismatch in {p!r}: the arrays hash to {digest[:16]}..., the header "
                              f"records {str(header.get('sha256'))[:16]}...; the file is corrupted. "
                              "Fix: restore from another checkpoint.")
    return header, arrays


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """The validated JSON header of a checkpoint (for inspection)."""
    return _read(path, "read_header")[0]


def read_state_dict(path: str | os.PathLike, *, ema: bool = False,
                    op: str = "read_state_dict") -> dict[str, np.ndarray]:
    """The parameters and batch-norm statistics a checkpoint holds, as ``task.state_dict()`` gives
    them (PyTorch names and layouts), read through the saved plan: no task, no data needed. For a
    task built on other data (inference, fine-tuning): ``task.load_state_dict(read_state_dict(path))``.
    ``ema=True`` reads the EMA model's, under the same names (a task saved with ``ema()`` on); ``op``
    is the call its errors name (``load_weights`` reads through here)."""
    as_flag(ema, op, "ema", CheckpointError, f"pass {op}(path, ema=True)")
    header, arrays = _read(path, op)
    fp = header.get("fingerprint", {})

    def incomplete(exc: Exception) -> CheckpointError:
        return CheckpointError(f"{op}: {os.fspath(path)!r} has an incomplete plan record ({exc}). "
                               "Fix: restore from another checkpoint.")
    try:
        tensors = {t["name"]: t for t in fp["tensors"]}
    except (KeyError, TypeError) as exc:
        raise incomplete(exc) from None
    if ema and not any(str(name).endswith("@ema") for name in tensors):
        raise CheckpointError(f"{op}: {os.fspath(path)!r} holds no EMA weights (its task trained "
                              "without ema()). Fix: drop ema=True.")
    out = {}
    try:
        for name, t in tensors.items():
            region = t["region"]
            if "@" in name or not (region.startswith("W_") and not region.startswith("W_EQ_")
                                   or region in ("B_PREV_MEAN", "B_PREV_VAR")):
                continue  # gradients, moments, EMA copies, folded BN and everything not a parameter
            if ema:
                t = tensors[f"{name}@ema"]
            region = Region[t["region"]]
            key = next(k for k, a, b in STATE_RANGES if a <= region <= b)
            where = DTensor(0, name, tuple(int(d) for d in t["shape"]), t["dtype"], region, 0,
                            int(t["offset"]) - int(fp["ranges"][key][0]), t.get("pitch"))
            out[name] = torch_layout(tensor_view(arrays[f"region_{key}"].view(np.uint8), where)).copy()
    except (KeyError, TypeError, ValueError, IndexError, StopIteration) as exc:
        raise incomplete(exc) from None
    return out


def _rows(tensor: dict[str, Any]) -> str:
    return f"rows padded to {tensor['pitch']}" if tensor.get("pitch") else "contiguous rows"


PLAN_OPTIONS = ("fuse", "liveness", "pad_rows")
"""The options() switches that change the plan's layout, which a checkpoint's bytes follow."""


def _compare_fingerprint(op: str, p: str, saved: dict[str, Any], now: dict[str, Any],
                         saved_options: dict[str, Any] | None = None, options: dict[str, Any] | None = None) -> None:
    fix = "Fix: build the task exactly as the saved one (same model, data shapes, batch size, optimizer)."
    differ = {k: v for k, v in (saved_options or {}).items() if k in PLAN_OPTIONS and (options or {}).get(k, v) != v}
    if differ:  # the likeliest cause of any difference below: say it first
        fix = (f"Fix: build the task with options({', '.join(f'{k}={v!r}' for k, v in differ.items())}), as the "
               "checkpoint was saved, or use DeepLearningTask.load(path, data), which does.")
    st, nt = saved.get("tensors", []), now["tensors"]
    # Shapes, dtypes and regions first: a different offset is usually a consequence of those.
    keys_by_pass = (("name", "shape", "dtype", "region", "pitch"), ("offset",))
    for keys in keys_by_pass:
        for i, (a, b) in enumerate(zip(st, nt)):
            if all(a.get(k) == b.get(k) for k in keys):
                continue
            if a.get("name") != b.get("name"):
                raise CheckpointError(f"{op}: {p!r} belongs to a different plan: tensor #{i} is "
                                      f"{a.get('name')!r} in the checkpoint but {b['name']!r} in this task. {fix}")
            diffs = [f"{k} {a.get(k)!r} in the checkpoint vs {b[k]!r} in this task"
                     for k in ("shape", "dtype", "region", "offset") if a.get(k) != b[k]]
            if a.get("pitch") != b.get("pitch"):
                diffs.insert(0, f"{_rows(a)} in the checkpoint vs {_rows(b)} in this task")
                fix = (f"Fix: build the task with options(pad_rows={bool(a.get('pitch'))}), as the checkpoint was "
                       "saved, or use DeepLearningTask.load(path, data), which does.")
            raise CheckpointError(f"{op}: {p!r} belongs to a different plan: tensor {b['name']!r} differs: "
                                  + "; ".join(diffs) + f". {fix}")
    if len(st) != len(nt):
        raise CheckpointError(f"{op}: {p!r} belongs to a different plan: it holds {len(st)} tensors, this task "
                              f"{len(nt)}. {fix}")
    if saved.get("total_bytes") != now["total_bytes"]:
        raise CheckpointError(f"{op}: {p!r} belongs to a different plan: arena of {saved.get('total_bytes')} bytes "
                              f"in the checkpoint vs {now['total_bytes']} in this task. {fix}")
    if saved.get("ranges") != now["ranges"]:
        raise CheckpointError(f"{op}: {p!r} belongs to a different plan: region ranges differ "
                              f"({saved.get('ranges')} vs {now['ranges']}). {fix}")
    if saved.get("blueprint") != now["blueprint"]:
        raise CheckpointError(f"{op}: {p!r} was saved from another model:\n{saved.get('blueprint')}\n"
                              f"but this task's model is:\n{now['blueprint']}\n{fix}")


FRESH_PLATEAU: dict[str, float] = {}
"""_validated's answer for a ReduceLROnPlateau state to start afresh once the checkpoint's table is in."""


def _brief(value: Any, limit: int = 160) -> str:
    """A setting's repr for a message, cut short (a loss with 1,000 class weights is 20,000 characters)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + " ...)"


def _validated(task: Any, header: dict[str, Any], arrays: dict[str, np.ndarray], p: str, strict: bool, op: str
               ) -> tuple[list[tuple[np.ndarray, np.ndarray]], int, tuple[int, int] | None, float, list[EpochRecord],
                          dict[str, float] | None]:
    """Everything load_state checks before it writes: the bytes to copy and the run's position."""
    options = {k: getattr(task, f"_{k}") for k in PLAN_OPTIONS}
    _compare_fingerprint(op, p, header.get("fingerprint", {}), fingerprint(task),
                         (header.get("spec") or {}).get("options"), options)
    if strict:
        saved, now = dict(header.get("settings", {})), _settings(task)
        if isinstance(saved.get("optimizer"), str):  # saved for a few commits with the default spelt out
            saved["optimizer"] = saved["optimizer"].replace(", maximize=False)", ")")
        for k in now:
            if saved.get(k, EXTRAS_OFF.get(k)) != now[k]:
                was, here = _brief(saved.get(k)), _brief(now[k])
                raise CheckpointError(f"{op}: setting {k} differs: {was} in {p!r} vs {here} in this task; resuming "
                                      f"would not reproduce the saved run. Fix: build the task with {k}={was}, or "
                                      "pass strict=False to load anyway.")
    # shapes of every array
    buf = task._arena.bytes
    plan = task.memory
    writes: list[tuple[np.ndarray, np.ndarray]] = []
    for key, first, last in STATE_RANGES:
        name = f"region_{key}"
        a, b = plan.region_range(first, last)
        arr = arrays.get(name)
        if arr is None or arr.dtype != np.uint8 or arr.shape != (b - a,):
            got = None if arr is None else f"{arr.dtype}{arr.shape}"
            raise CheckpointError(f"{op}: {p!r} entry {name} is {got}, expected uint8({b - a},). "
                                  "Fix: restore from a checkpoint of this plan.")
        writes.append((buf[a:b], arr))
    for split, perm in task._env.perms.items():
        name = f"perm_{split}"
        arr = arrays.get(name)
        if arr is None or arr.shape != perm.shape or arr.dtype != np.int64:
            raise CheckpointError(f"{op}: {p!r} entry {name} does not fit this task's {split} data "
                                  f"({perm.shape[0]} samples). Fix: use the same data as the saved task.")
        if not np.array_equal(np.sort(arr), np.arange(perm.shape[0])):
            raise CheckpointError(f"{op}: {p!r} entry {name} is not a permutation. Fix: restore from another "
                                  "checkpoint.")
        writes.append((perm, arr))
    epoch = int(header["epoch"])
    resume = header.get("resume_at")
    resume_at = None if resume is None else (int(resume[0]), int(resume[1]))
    resume_seconds = float(header.get("resume_seconds", 0.0)) if resume_at else 0.0
    history = [EpochRecord(**r) for r in header.get("history", [])]
    if not 0 <= epoch <= task._epochs or len(history) != epoch:
        raise CheckpointError(f"{op}: {p!r} records epoch {epoch} with {len(history)} history rows for a task of "
                              f"{task._epochs} epochs. Fix: restore from another checkpoint.")
    if resume_at is not None and (resume_at[0] != epoch or not 0 <= resume_at[1] <= task.steps_per_epoch):
        raise CheckpointError(f"{op}: {p!r} resumes at step {resume_at[1]} of epoch {resume_at[0] + 1}, outside "
                              f"epoch {epoch + 1} of {task.steps_per_epoch} steps. Fix: restore from another checkpoint.")
    plateau, sched = header.get("plateau"), task._scheduler
    if not hasattr(sched, "initial_state"):  # this task's schedule keeps no state (strict=False can get here)
        plateau = None
    elif plateau is not None and (header.get("settings") or {}).get("scheduler") == repr(sched):
        plateau = {k: float(plateau[k]) for k in ("best", "lr")} | {k: int(plateau[k]) for k in ("bad", "cooldown")}
    else:  # saved with another schedule or monitor (strict=False): start afresh from the rate in force
        plateau = FRESH_PLATEAU
    return writes, epoch, resume_at, resume_seconds, history, plateau


def load_state(task: Any, path: str | os.PathLike, *, strict: bool = True) -> Any:
    """Restore a checkpoint into a compiled task built the same way; returns the task.

    Everything is checked first (file, integrity, checksum, plan fingerprint and,
    with ``strict``, the settings: seed, optimizer, loss, scheduler, epochs, batch
    size, data sizes); only then are bytes copied in, so a failed load changes
    nothing. ``strict=False`` allows different settings (e.g. to fine-tune with
    another optimizer); the saved lr table and counters are still restored, the task's
    own class weights are kept, and a ReduceLROnPlateau saved with other settings (or
    another schedule) starts afresh: the restored table's rate at the next step holds
    from there on, until its first reduction.
    """
    op = "load_state"
    _require_compiled(task, op)
    as_flag(strict, op, "strict", CheckpointError, "pass strict=False to allow other settings, or leave it out")
    header, arrays = _read(path, op)
    p = os.fspath(path)
    try:  # a header edited by hand (the checksum covers the arrays): any shape it has is this error
        writes, epoch, resume_at, resume_seconds, history, plateau = _validated(task, header, arrays, p, strict, op)
    except CheckpointError:
        raise
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
        raise CheckpointError(f"{op}: the header of {p!r} is malformed ({type(exc).__name__}: {exc}). "
                              "Fix: restore from another checkpoint.") from None
    # ---- commit: nothing below can fail on a validated file
    for dst, src in writes:
        dst[...] = src
    task._epoch = epoch
    task._resume_at = resume_at
    task._torn_at = None  # a step left half done before the load is gone with the state it tore
    if task._loss.weight_ is not None:  # the task's own loss, even when strict=False loaded another's
        task.executor.view("train_base", "loss.weight")[...] = task._loss.class_weights
    if plateau is FRESH_PLATEAU:  # the loaded table's rate at the next step holds from there on, as
        table = task.executor.view("train_base", "lr_table")  # a plateau schedule's constant rate
        step = min(int(task.executor.view("train_base", "step")[0]), len(table) - 1)
        table[step:] = table[step]
        plateau = task._plateau_start(float(table[step]))
    task._plateau = plateau
    task._partial_seconds = resume_seconds
    task.result.history = history
    task.result.interrupted = bool(header.get("interrupted", False))
    steps = int(task.executor.view("train_base", "step")[0])
    task.result.step_losses = task.executor.view("train_base", "loss_log")[:steps].copy()
    return task
