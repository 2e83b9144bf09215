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
* ``header.json``: a uint8 array holding UTF-8 JSON: format and version, the plan
  fingerprint (the BluePrint as data, name/shape/dtype/region/offset of every
  tensor of the train_base plan, total arena bytes, the byte range of each saved
  region), ``config`` (every setting as data: ``TaskConfig.to_dict()``), ``run``
  (epoch, resume position, history, ReduceLROnPlateau's state), and a SHA-256 over
  the array bytes in a fixed (sorted key) order. Version 1 files (settings as reprs
  and a "spec") are read and upgraded to this form on load.

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

This module never imports the task: ``save`` and ``load_state`` take any compiled object with
public ``phases``, ``config``, ``runner`` and ``run_state`` (a DeepLearningTask is one).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..checks import as_flag
from ..config import PLAN_OPTIONS, STRICT_FIELDS, TaskConfig, describe_value
from ..errors import CheckpointError
from ..files import write_atomically
from ..memory.dtensor import DTensor, tensor_view, torch_layout
from ..memory.region import Region
from ..phases import Phase
from ..result import EpochRecord
from .trainer import RunState, plateau_start

FORMAT = "renaissance_nb.checkpoint"
VERSION = 2
"""2: the config as data (TaskConfig.to_dict) and the run state apart; 1 (read and upgraded): settings as reprs."""
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
def _parts(task: Any, op: str) -> tuple[TaskConfig, Any, RunState]:
    """The config, runner and run state of a compiled task; a CheckpointError or PhaseError otherwise."""
    phases = getattr(task, "phases", None)
    if not all(hasattr(task, k) for k in ("config", "runner", "run_state")) or phases is None:
        raise CheckpointError(f"{op}: task={type(task).__name__} is invalid; expected a DeepLearningTask. "
                              "Fix: pass the DeepLearningTask to save or restore.")
    phases.require(op, Phase.COMPILED, hint="Fix: call task.compile() first (build the task the same way "
                                            "as the one that was saved).")
    return task.config, task.runner, task.run_state


def fingerprint(config: TaskConfig, runner: Any) -> dict[str, Any]:
    """What must match between the saved task and the one restored into."""
    plan = runner.compiled.plan
    tensors = [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "region": t.region.name,
                "offset": int(t.offset), **({"pitch": t.pitch} if t.pitch is not None else {})} for t in plan]
    ranges = {key: list(plan.region_range(a, b)) for key, a, b in STATE_RANGES}
    assert config.model is not None  # compiled
    return {"blueprint": config.model.to_dict(), "tensors": tensors, "total_bytes": int(plan.total_bytes),
            "ranges": ranges}


def config_record(config: TaskConfig) -> dict[str, Any]:
    """``config.to_dict()`` as JSON reads it back (lists for tuples), for comparing with a file's."""
    return json.loads(json.dumps(config.to_dict()))


def run_record(state: RunState) -> dict[str, Any]:
    at = state.resume_at or state.live_at  # mid-epoch: after a stop, or from a step callback inside run()
    return {"epoch": int(state.epoch), "resume_at": None if at is None else [int(v) for v in at],
            "resume_seconds": state.seconds_into_epoch(),
            "history": [dict(r.__dict__) for r in state.result.history],
            "interrupted": bool(state.result.interrupted),
            "plateau": state.plateau}  # ReduceLROnPlateau's state; its lowered rates are in the table (region S)


EXTRAS_OFF = {"ema": None, "clip_grad_norm": None, "train_resolution": None,
              "augment": {"crop_pad": 0, "flip": False}, "channels_last": False, "precision": "fp32"}
"""What a file without these records trained with (they did not exist yet, or are recorded only when on: off)."""


def _upgraded(header: dict[str, Any]) -> dict[str, Any]:
    """A version-1 header in version 2's form: its spec and settings as the config, its run fields as run."""
    spec, settings = header.get("spec"), header.get("settings", {})
    if not isinstance(spec, dict) or not isinstance(settings, dict):
        raise TypeError("a version-1 header without a task spec")
    config = {**EXTRAS_OFF, **spec, "n_train": settings.get("n_train"), "n_val": settings.get("n_val")}
    run = {k: header[k] for k in ("epoch", "resume_at", "resume_seconds", "history", "interrupted", "plateau")
           if k in header}
    fp = dict(header.get("fingerprint") or {})
    fp["blueprint"] = spec.get("blueprint")
    return {"format": FORMAT, "version": VERSION, "written_as": 1, "fingerprint": fp, "config": config,
            "run": run, "sha256": header.get("sha256")}


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}|{a.dtype.str}|{a.shape}\n".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _state_arrays(runner: Any) -> dict[str, np.ndarray]:
    buf, plan = runner.arena.bytes, runner.compiled.plan
    out = {}
    for key, first, last in STATE_RANGES:
        a, b = plan.region_range(first, last)
        out[f"region_{key}"] = buf[a:b].copy()
    for split, perm in sorted(runner.perms.items()):
        out[f"perm_{split}"] = np.asarray(perm, dtype=np.int64).copy()
    return out


# ---- save ------------------------------------------------------------------------------------
def save(task: Any, path: str | os.PathLike) -> str:
    """Write the state of a compiled task to ``path`` atomically; returns the path. On a distributed
    task every rank calls it: the state is made global, rank 0 writes, the others wait for the file."""
    config, runner, state = _parts(task, "save")
    dp = runner.dp
    if dp is None:
        return _save(config, runner, state, path)
    writer = dp.before_save(runner)
    try:
        return _save(config, runner, state, path) if writer else os.fspath(path)
    finally:
        dp.after_save()


def _save(config: TaskConfig, runner: Any, state: RunState, path: str | os.PathLike) -> str:
    runner.drain_transfers()  # a background copy may still be writing an input buffer
    if state.live_at is not None:  # called from a step callback on a device: its state is current
        runner.replay.download_all()
    arrays = _state_arrays(runner)
    from .. import __version__
    header = {"format": FORMAT, "version": VERSION, "library": __version__, "fingerprint": fingerprint(config, runner),
              "config": config.to_dict(), "run": run_record(state), "sha256": _digest(arrays)}
    blob = np.frombuffer(json.dumps(header, sort_keys=True).encode("utf-8"), np.uint8)
    return write_atomically(path, lambda f: np.savez(f, **arrays, **{HEADER_KEY: blob}), op="save",
                            error=CheckpointError, example="run.npz", verb="save")


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
    version = header.get("version")
    if version not in (1, VERSION):
        by = f" by renaissance_nb {header['library']}" if isinstance(header.get("library"), str) else ""
        raise CheckpointError(f"{op}: {p!r} was written{by} in checkpoint format version {version!r}; this library "
                              f"reads versions 1 and {VERSION}. Fix: load it with the renaissance_nb version that "
                              "wrote it.")
    digest = _digest(arrays)
    if digest != header.get("sha256"):
        raise CheckpointError(f"{op}: checksum mismatch in {p!r}: the arrays hash to {digest[:16]}..., the header "
                              f"records {str(header.get('sha256'))[:16]}...; the file is corrupted. "
                              "Fix: restore from another checkpoint.")
    if version == 1:
        try:
            header = _upgraded(header)
        except (TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"{op}: {p!r} was written in checkpoint format version 1 and its header cannot be "
                                  f"read as that version's ({exc}). Fix: load it with the renaissance_nb version that "
                                  "wrote it, or restore from another checkpoint.") from None
    return header, arrays


def read_header(path: str | os.PathLike) -> dict[str, Any]:
    """The validated JSON header of a checkpoint (for inspection), in this version's form (a version-1
    header is upgraded; ``written_as`` then says so)."""
    return _read(path, "read_header")[0]


CONFIG_NEEDS = ("blueprint", "loss", "optimizer", "scheduler", "total_epochs", "seed", "batch_size",
                "val_batch_size", "shuffle", "options")
"""The keys of a header's config record that rebuilding its task reads."""


def saved_config(path: str | os.PathLike) -> dict[str, Any]:
    """The task config a checkpoint's header records, with every key a rebuild reads (``train --resume`` reads its
    flags there too); a header edited by hand (the checksum covers the arrays only) is refused by name."""
    record = read_header(path).get("config")
    lacking = [k for k in CONFIG_NEEDS if k not in record] if isinstance(record, dict) else list(CONFIG_NEEDS)
    if lacking:
        raise CheckpointError(f"load: the task config in {os.fspath(path)!r} lacks {', '.join(lacking)}. Fix: build "
                              "the task yourself and call task.load_state(path).")
    assert isinstance(record, dict)  # lacking lists every key of anything else
    return record


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
            key = _state_key(region.name)
            where = DTensor(0, name, tuple(int(d) for d in t["shape"]), t["dtype"], region, 0,
                            int(t["offset"]) - int(fp["ranges"][key][0]), t.get("pitch"))
            out[name] = torch_layout(tensor_view(arrays[f"region_{key}"].view(np.uint8), where)).copy()
    except (KeyError, TypeError, ValueError, IndexError, StopIteration) as exc:
        raise incomplete(exc) from None
    return out


def _rows(tensor: dict[str, Any]) -> str:
    return f"rows padded to {tensor['pitch']}" if tensor.get("pitch") else "contiguous rows"


def _state_key(region: str) -> str | None:
    """The STATE_RANGES key of a region name, or None for a region that carries no state (F, T, G, ...)."""
    try:
        r = Region[region]
    except KeyError:
        return None
    return next((k for k, first, last in STATE_RANGES if first <= r <= last), None)


def _state_tensors(fp: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The fingerprint's tensors that carry state, by name, each with the bytes its slot spans in its
    range (to the next tensor of the range, or the range's end)."""
    out: dict[str, dict[str, Any]] = {}
    for t in fp.get("tensors", []):
        key = _state_key(str(t.get("region")))
        if key is not None:
            out[t["name"]] = {**t, "key": key}
    ends = {k: int(v[1]) for k, v in fp.get("ranges", {}).items()}
    by_start = sorted(out.values(), key=lambda t: int(t["offset"]))
    for i, t in enumerate(by_start):
        later = [int(u["offset"]) for u in by_start[i + 1:] if u["key"] == t["key"]]
        t["extent"] = (later[0] if later else ends.get(t["key"], int(t["offset"]))) - int(t["offset"])
    return out


def _compare_fingerprint(op: str, p: str, saved: dict[str, Any], now: dict[str, Any],
                         saved_options: dict[str, Any] | None = None, options: dict[str, Any] | None = None) -> bool:
    """Refuses a checkpoint of another model or another state layout. The tensors that carry state (W, B,
    E, M, V, I, S, R) must match by name, shape, dtype, region and row pitch; where the rest of the plan
    moved them (temporaries packed otherwise, scratch a newer library plans), they are restored tensor by
    tensor. Returns whether the state ranges lie exactly as saved (then they are copied whole)."""
    fix = "Fix: build the task exactly as the saved one (same model, data shapes, batch size, optimizer)."
    was = {"fold_bn": False, **saved_options} if saved_options is not None else {}  # written before fold_bn existed
    differ = {k: v for k, v in was.items() if k in PLAN_OPTIONS and (options or {}).get(k, v) != v}
    if differ:  # the likeliest cause of any difference below: say it first
        fix = (f"Fix: build the task with options({', '.join(f'{k}={v!r}' for k, v in differ.items())}), as the "
               "checkpoint was saved, or use DeepLearningTask.load(path, data), which does.")
    st, nt = _state_tensors(saved), _state_tensors(now)
    for name, b in nt.items():
        a = st.get(name)
        if a is None:
            raise CheckpointError(f"{op}: {p!r} belongs to a different plan: it holds no tensor {name!r}, which this "
                                  f"task keeps state in. {fix}")
        diffs = [f"{k} {a.get(k)!r} in the checkpoint vs {b[k]!r} in this task"
                 for k in ("shape", "dtype", "region") if a.get(k) != b[k]]
        if a.get("pitch") != b.get("pitch"):
            diffs.insert(0, f"{_rows(a)} in the checkpoint vs {_rows(b)} in this task")
            fix = (f"Fix: build the task with options(pad_rows={bool(a.get('pitch'))}), as the checkpoint was "
                   "saved, or use DeepLearningTask.load(path, data), which does.")
        if diffs:
            raise CheckpointError(f"{op}: {p!r} belongs to a different plan: tensor {name!r} differs: "
                                  + "; ".join(diffs) + f". {fix}")
    extra = sorted(set(st) - set(nt))
    if extra:
        raise CheckpointError(f"{op}: {p!r} belongs to a different plan: it keeps state in {extra[:5]}, which this "
                              f"task does not have. {fix}")
    if saved.get("blueprint") != now["blueprint"]:
        raise CheckpointError(f"{op}: {p!r} was saved from another model:\n{_model_text(saved.get('blueprint'))}\n"
                              f"but this task's model is:\n{_model_text(now['blueprint'])}\n{fix}")
    return saved.get("ranges") == now["ranges"] and all(
        int(st[n]["offset"]) == int(nt[n]["offset"]) for n in nt)


def _model_text(record: Any) -> str:
    """A BluePrint record as its repr (the record itself where it does not rebuild)."""
    from ..blueprint import BluePrint
    try:
        return repr(BluePrint.from_dict(record))
    except Exception:  # noqa: BLE001 - a hand-edited record: show it as it is
        return repr(record)


FRESH_PLATEAU: dict[str, float] = {}
"""_loaded_plateau's answer for a ReduceLROnPlateau state to start afresh once the checkpoint's table is in."""


@dataclass
class _Loaded:
    """Everything load_state checked, ready to commit: the bytes to copy and the run's position."""

    writes: list[tuple[np.ndarray, np.ndarray]]
    epoch: int
    resume_at: tuple[int, int] | None
    resume_seconds: float
    history: list[EpochRecord]
    interrupted: bool
    plateau: dict[str, float] | None


SIZING_FIELDS = ("total_epochs", "batch_size")
"""Settings that size the plan's state (the loss log and lr table by steps, the batch buffers): a checkpoint of
other values cannot load, strict or not (val_batch_size sizes nothing saved: strict=True compares it)."""


def _check_sizing(op: str, p: str, saved: dict[str, Any], now: dict[str, Any]) -> None:
    """Names a differing sizing setting before the tensors it resizes do (the loss log's shape said nothing of
    total_epochs)."""
    for k in SIZING_FIELDS:
        if k in saved and saved[k] != now.get(k):
            raise CheckpointError(f"{op}: setting {k} differs: {describe_value(saved[k])} in {p!r} vs "
                                  f"{describe_value(now.get(k))} in this task; it sizes the plan's state (the loss "
                                  f"log, the batch buffers), so the checkpoint cannot load here even with "
                                  f"strict=False. Fix: build the task with {k}={describe_value(saved[k])}, or load "
                                  "its weights alone with task.load_weights(path).")


def _check_settings(op: str, p: str, saved: dict[str, Any], now: dict[str, Any]) -> None:
    """strict: every setting a resumed run must share (STRICT_FIELDS) equal as data."""
    for k in STRICT_FIELDS:
        if saved.get(k, EXTRAS_OFF.get(k)) != now.get(k, EXTRAS_OFF.get(k)):
            was, here = describe_value(saved.get(k, EXTRAS_OFF.get(k))), describe_value(now.get(k, EXTRAS_OFF.get(k)))
            raise CheckpointError(f"{op}: setting {k} differs: {was} in {p!r} vs {here} in this task; resuming "
                                  f"would not reproduce the saved run. Fix: build the task with {k}={was}, or "
                                  "pass strict=False to load anyway.")


def _range_writes(op: str, p: str, arrays: dict[str, np.ndarray], runner: Any
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(destination, source) of every saved range, when the ranges lie exactly as saved."""
    buf, plan = runner.arena.bytes, runner.compiled.plan
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
    return writes


def _tensor_writes(op: str, p: str, arrays: dict[str, np.ndarray], runner: Any, saved_fp: dict[str, Any]
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(destination, source) of every state tensor, each from its place in the saved ranges to its place
    in this arena (the plan moved them; _compare_fingerprint checked they are the same tensors)."""
    buf, plan = runner.arena.bytes, runner.compiled.plan
    saved = _state_tensors(saved_fp)
    writes: list[tuple[np.ndarray, np.ndarray]] = []
    for t in plan:
        key = _state_key(t.region.name)
        if key is None:
            continue
        s = saved[t.name]
        arr = arrays.get(f"region_{key}")
        start = int(s["offset"]) - int(saved_fp["ranges"][key][0])
        n = min(int(s["extent"]), t.slot_bytes)
        if arr is None or arr.dtype != np.uint8 or start < 0 or start + n > arr.shape[0]:
            raise CheckpointError(f"{op}: {p!r} entry region_{key} does not hold {t.name!r} where its plan record "
                                  "says. Fix: restore from another checkpoint.")
        writes.append((buf[t.offset:t.offset + n], arr[start:start + n]))
    return writes


def _writes(op: str, p: str, arrays: dict[str, np.ndarray], runner: Any, saved_fp: dict[str, Any],
            same_layout: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """(destination, source) of the saved state and data orders, each checked against this plan."""
    writes = (_range_writes(op, p, arrays, runner) if same_layout
              else _tensor_writes(op, p, arrays, runner, saved_fp))
    for split, perm in runner.perms.items():
        name = f"perm_{split}"
        arr = arrays.get(name)
        if arr is None or arr.shape != perm.shape or arr.dtype != np.int64:
            raise CheckpointError(f"{op}: {p!r} entry {name} does not fit this task's {split} data "
                                  f"({perm.shape[0]} samples). Fix: use the same data as the saved task.")
        if not np.array_equal(np.sort(arr), np.arange(perm.shape[0])):
            raise CheckpointError(f"{op}: {p!r} entry {name} is not a permutation. Fix: restore from another "
                                  "checkpoint.")
        writes.append((perm, arr))
    return writes


def _loaded_plateau(run: dict[str, Any], saved: dict[str, Any], now: dict[str, Any], config: TaskConfig
                    ) -> dict[str, float] | None:
    plateau = run.get("plateau")
    if not hasattr(config.scheduler, "initial_state"):  # this task's schedule keeps no state (strict=False)
        return None
    if plateau is not None and saved.get("scheduler") == now["scheduler"]:
        return {k: float(plateau[k]) for k in ("best", "lr")} | {k: int(plateau[k]) for k in ("bad", "cooldown")}
    return FRESH_PLATEAU  # saved with another schedule or monitor (strict=False): start afresh from the rate in force


def _validated(op: str, p: str, header: dict[str, Any], arrays: dict[str, np.ndarray], strict: bool,
               config: TaskConfig, runner: Any) -> _Loaded:
    """Everything load_state checks before it writes."""
    saved, now = header.get("config") or {}, config_record(config)
    ranks = int((saved.get("distributed") or {}).get("ranks", 1))
    if ranks != config.ranks:
        raise CheckpointError(f"{op}: {p!r} was written by a run on {ranks} rank(s); this task runs on "
                              f"{config.ranks}. A checkpoint resumes on the rank count that wrote it (each rank's "
                              f"plan holds its shard of the batch). Fix: start with mpiexec -n {ranks}"
                              + (", or load its weights alone with task.load_weights(path)." if ranks > 1 else "."))
    _check_sizing(op, p, saved, now)
    saved_fp = header.get("fingerprint", {})
    same_layout = _compare_fingerprint(op, p, saved_fp, fingerprint(config, runner), saved.get("options"),
                                       {k: getattr(config, k) for k in PLAN_OPTIONS})
    if strict:
        _check_settings(op, p, saved, now)
    writes = _writes(op, p, arrays, runner, saved_fp, same_layout)
    run = header["run"]
    epoch = int(run["epoch"])
    resume = run.get("resume_at")
    resume_at = None if resume is None else (int(resume[0]), int(resume[1]))
    resume_seconds = float(run.get("resume_seconds", 0.0)) if resume_at else 0.0
    history = [EpochRecord(**r) for r in run.get("history", [])]
    if not 0 <= epoch <= config.total_epochs or len(history) != epoch:
        raise CheckpointError(f"{op}: {p!r} records epoch {epoch} with {len(history)} history rows for a task of "
                              f"{config.total_epochs} epochs. Fix: restore from another checkpoint.")
    spe = config.steps_per_epoch
    if resume_at is not None and (resume_at[0] != epoch or not 0 <= resume_at[1] <= spe):
        raise CheckpointError(f"{op}: {p!r} resumes at step {resume_at[1]} of epoch {resume_at[0] + 1}, outside "
                              f"epoch {epoch + 1} of {spe} steps. Fix: restore from another checkpoint.")
    return _Loaded(writes, epoch, resume_at, resume_seconds, history, bool(run.get("interrupted", False)),
                   _loaded_plateau(run, saved, now, config))


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
    config, runner, state = _parts(task, op)
    as_flag(strict, op, "strict", CheckpointError, "pass strict=False to allow other settings, or leave it out")
    header, arrays = _read(path, op)
    p = os.fspath(path)
    try:  # a header edited by hand (the checksum covers the arrays): any shape it has is this error
        loaded = _validated(op, p, header, arrays, strict, config, runner)
    except CheckpointError:
        raise
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
        raise CheckpointError(f"{op}: the header of {p!r} is malformed ({type(exc).__name__}: {exc}). "
                              "Fix: restore from another checkpoint.") from None
    _commit(loaded, config, runner, state)
    if runner.dp is not None:
        runner.dp.after_load(runner)
    return task


def _commit(loaded: _Loaded, config: TaskConfig, runner: Any, state: RunState) -> None:
    """Nothing here can fail on a validated file."""
    for dst, src in loaded.writes:
        dst[...] = src
    state.epoch, state.resume_at = loaded.epoch, loaded.resume_at
    state.torn_at = None  # a step left half done before the load is gone with the state it tore
    if config.loss.weight_ is not None:  # the task's own loss, even when strict=False loaded another's
        runner.view("loss.weight")[...] = config.loss.class_weights
    plateau = loaded.plateau
    if plateau is FRESH_PLATEAU:  # the loaded table's rate at the next step holds from there on, as
        table = runner.view("lr_table")  # a plateau schedule's constant rate
        step = min(int(runner.view("step")[0]), len(table) - 1)
        table[step:] = table[step]
        plateau = plateau_start(config, float(table[step]))
    state.plateau = plateau
    state.partial_seconds = loaded.resume_seconds
    state.result.history = loaded.history
    state.result.interrupted = loaded.interrupted
    steps = int(runner.view("step")[0])
    state.result.step_losses = runner.view("loss_log")[:steps].copy()
