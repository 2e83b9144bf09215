"""MemoryPlan: allocation records, finalize() into one aligned arena, region table.

Nothing is allocated at run time: every tensor of a task is a DTensor placed
here, and the executor turns each into a view of one arena. Regions are laid out
in enum order, each starting on a 256-byte boundary; tensors inside a region in
allocation order, or packed by liveness when the region holds short-lived data.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, Mapping, Sequence

import numpy as np

from ..checks import as_int
from ..errors import PlanError, bad_argument
from ..text import bytes_versus, human_bytes, plural
from .dtensor import ALIGNMENT, DTensor, align_up, register_dtype
from .liveness import Lifetimes, check_lifetimes, live_overlaps, pack
from .region import FAMILIES, Region

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8")
"""bfloat16 is ml_dtypes' NumPy dtype (imported on first use by memory/dtensor.py's register_dtype)."""


@dataclass(frozen=True)
class RegionSpan:
    """One region's place in the arena: base offset, size, and its tensors' ids."""

    region: Region
    base: int
    size: int
    tensor_ids: tuple[int, ...]
    size_without_reuse: int

    @property
    def end(self) -> int:
        return self.base + self.size


def _check_shape(shape: object, where: str = "alloc") -> tuple[int, ...]:
    one = as_int(shape)  # a bare int is a 1-D shape; a bool is not a size
    dims: list[int | None]
    if one is not None:
        dims = [one]
    else:
        dims = [as_int(d) for d in shape] if isinstance(shape, (tuple, list)) else [None]
    if None in dims:
        raise bad_argument(PlanError, where, "shape", shape, "a tuple of positive ints like (128, 784)",
                           "pass the tensor's dimensions as ints")
    if any(d <= 0 for d in dims):  # type: ignore[operator]
        raise bad_argument(PlanError, where, "shape", shape, "every dimension >= 1",
                           "a tensor with a zero or negative dimension cannot hold data; fix the size")
    return tuple(dims)  # type: ignore[arg-type]


def _check_dtype(dtype: object) -> str:
    register_dtype(dtype)
    try:  # None is refused: np.dtype(None) would quietly mean float64
        name = None if dtype is None else np.dtype(dtype).name  # type: ignore[arg-type, call-overload]
    except TypeError:
        name = None
    if name not in SUPPORTED_DTYPES:
        raise bad_argument(PlanError, "alloc", "dtype", dtype, f"one of {SUPPORTED_DTYPES}",
                           "use a supported dtype such as 'float32'")
    return name


def _check_pitch(pitch: object, shape: tuple[int, ...]) -> int | None:
    if pitch is None:
        return None
    pitch_i = as_int(pitch)
    if pitch_i is None or len(shape) != 2 or pitch_i < shape[1]:
        rows = f"an int >= {shape[1]}, its row length" if len(shape) == 2 else "None: only 2-D tensors have rows"
        raise bad_argument(PlanError, "alloc", "pitch", pitch, f"None or {rows}" if len(shape) == 2 else rows,
                           "pass pitch=None to store the tensor contiguous"
                           + (f", or a pitch of at least {shape[1]} elements" if len(shape) == 2 else ""))
    return pitch_i


def _check_region(region: object, where: str = "alloc", argument: str = "region",
                  fix: str = "every tensor must be placed in a named region; pass region=Region.<NAME>") -> Region:
    """A named region (a Region member or its name); END is a sentinel, not a place."""
    if isinstance(region, Region) and region is not Region.END:
        return region
    if isinstance(region, str) and region in Region.__members__ and region != "END":
        return Region[region]
    raise bad_argument(PlanError, where, argument, region,
                       "a Region member such as Region.T_TEMP_FP32 (or its name), not Region.END", fix)


def _check_slot_bytes(slot_bytes: object, nbytes: int, padded: bool) -> int:
    """The bytes reserved for a tensor: an int, at least its storage (a float would be cut silently)."""
    if slot_bytes is None:
        return nbytes
    slot = as_int(slot_bytes)
    if slot is None or slot < nbytes:
        raise bad_argument(PlanError, "alloc", "slot_bytes", slot_bytes,
                           f"None or an int >= {nbytes} (the tensor's size{' with its padded rows' if padded else ''})",
                           "reserve at least the tensor's bytes, or pass None to reserve exactly them")
    return slot


class MemoryPlan:
    """Allocation records plus, after finalize(), offsets and the region table."""

    def __init__(self, name: str = "plan") -> None:
        self.name = name
        self._tensors: list[DTensor] = []
        self._by_name: dict[str, int] = {}
        self.regions: dict[Region, RegionSpan] = {}
        self.total_bytes: int = 0
        self.bytes_without_reuse: int = 0
        self.finalized = False
        self.reuse = False
        self.lifetimes: Lifetimes = {}
        self.merged: dict[str, str] = {}
        """Tensor names a compiler fusion removed -> the tensor that holds their value (relu5.out -> add2.out)."""

    # ---- PLANNING -------------------------------------------------------------------
    def alloc(self, shape: Sequence[int], dtype: object, region: object, name: str | None = None,
              slot_bytes: int | None = None, pitch: int | None = None) -> DTensor:
        """Record a tensor; it gets its offset at finalize(). ``region`` is mandatory.
        ``pitch``: store a 2-D tensor's rows this many elements apart (padded rows, see
        ``dtensor.row_pitch``); None stores it contiguous."""
        if self.finalized:
            raise PlanError(f"alloc: the plan {self.name!r} is finalized; offsets are fixed. "
                            "Fix: allocate every tensor before finalize().")
        shape_t = _check_shape(shape)
        dtype_s = _check_dtype(dtype)
        region_r = _check_region(region)
        tid = len(self._tensors)
        if name is not None and not isinstance(name, str):
            raise bad_argument(PlanError, "alloc", "name", name, "a str or None",
                               "name tensors with strings: plan[5] means tensor id 5, plan['5'] a tensor's name")
        name = name or f"t{tid}"
        if name in self._by_name:
            raise bad_argument(PlanError, "alloc", "name", name, "a name not used by another tensor",
                               "give each tensor a unique name")
        pitch_i = _check_pitch(pitch, shape_t)
        t = DTensor(tid, name, shape_t, dtype_s, region_r, 0, pitch=pitch_i, plan=self)
        t = replace(t, slot_bytes=_check_slot_bytes(slot_bytes, t.storage_bytes, pitch_i is not None))
        self._tensors.append(t)
        self._by_name[name] = tid
        return t

    def finalize(self, lifetimes: Lifetimes | None = None) -> "MemoryPlan":
        """Fix every offset. With ``lifetimes``, F_ and T_ tensors whose lifetimes
        never meet share bytes; without, every tensor gets its own slot.

        All or nothing: ``lifetimes`` is checked whole before any state changes, so a failed
        call leaves the plan as it was (unfinalized, ready for a corrected call)."""
        if self.finalized:
            raise PlanError(f"finalize: the plan {self.name!r} is already finalized.")
        reuse = lifetimes is not None
        lives = check_lifetimes(lifetimes, len(self._tensors)) if reuse else {}
        by_region: dict[Region, list[DTensor]] = {}
        for t in self._tensors:
            by_region.setdefault(t.region, []).append(t)
        cursor = 0
        placed: dict[int, DTensor] = {}
        regions: dict[Region, RegionSpan] = {}
        for region in Region:
            if region is Region.END:
                continue
            members = by_region.get(region, [])
            base = align_up(cursor)
            plain = sum(align_up(t.slot_bytes) for t in members)
            if reuse and region.reusable and members:
                rel, size = pack(members, lives)
            else:
                rel, off = {}, 0
                for t in members:
                    rel[t.id] = off
                    off += align_up(t.slot_bytes)
                size = off
            for t in members:
                placed[t.id] = replace(t, offset=base + rel[t.id])
            regions[region] = RegionSpan(region, base, size, tuple(t.id for t in members), plain)
            cursor = base + size
        self.lifetimes, self.reuse, self.regions = lives, reuse, regions
        self._tensors = [placed[t.id] for t in self._tensors]
        self.total_bytes = align_up(cursor)
        self.bytes_without_reuse = sum(s.size_without_reuse for s in regions.values())
        self.finalized = True
        return self

    # ---- queries --------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._tensors)

    def __iter__(self) -> Iterator[DTensor]:
        return iter(self._tensors)

    def __getitem__(self, key: int | str) -> DTensor:
        if isinstance(key, str):
            if key in self.merged and key not in self._by_name:
                layer, into = key.split(".", 1)[0], self.merged[key]
                raise bad_argument(PlanError, "MemoryPlan", "name", key, "the name of an allocated tensor",
                                   f"{layer} was fused into {into.split('.', 1)[0]}: read {into!r}, which holds its "
                                   "value (options(fuse=False) keeps the layers apart)")
            if key not in self._by_name:
                raise bad_argument(PlanError, "MemoryPlan", "name", key, "the name of an allocated tensor",
                                   "list the names with [t.name for t in plan] "
                                   "(a task's plan: task.plans['train_base'])")
            key = self._by_name[key]
        tid = as_int(key)  # not a bool: plan[True] would quietly mean tensor #1
        if tid is None or not 0 <= tid < len(self._tensors):
            raise bad_argument(PlanError, "MemoryPlan", "tensor id", key,
                               f"an int in [0, {len(self._tensors)})", "use the id of a DTensor from alloc()")
        return self._tensors[tid]

    def has(self, tid: int) -> bool:
        i = as_int(tid)
        return i is not None and 0 <= i < len(self._tensors)

    def tensors_in(self, region: Region) -> list[DTensor]:
        return [t for t in self._tensors if t.region is region]

    def region_range(self, first: Region, last: Region) -> tuple[int, int]:
        """Byte range [start, end) from the base of ``first`` to the end of ``last``
        (Region members or their names; ``last`` not before ``first``)."""
        self._require_final("region_range")
        fix = "pass named regions, e.g. region_range(Region.W_BN_BIAS, Region.W_DEEP_CONV)"
        a = _check_region(first, "region_range", "first", fix)
        b = _check_region(last, "region_range", "last", fix)
        if b < a:
            raise bad_argument(PlanError, "region_range", "last", last,
                               f"a region at or after first={a.name} (regions run in address order)",
                               "swap first and last")
        return self.regions[a].base, self.regions[b].end

    def family_bytes(self) -> dict[str, int]:
        """Arena bytes by region family, in address order."""
        out: dict[str, int] = {}
        for span in self.regions.values():
            if span.size:
                out[span.region.family] = out.get(span.region.family, 0) + span.size
        return out

    def shared_bytes(self) -> list[tuple[DTensor, DTensor, int]]:
        """Pairs of temporaries (F, T) whose slots overlap, lower offset first, with the bytes they share:
        liveness reuse put them there because their lifetimes never meet (live_overlaps() checks that)."""
        self._require_final("shared_bytes")
        reusable = sorted((t for t in self._tensors if t.region.reusable), key=lambda t: t.offset)
        out = []
        for i, a in enumerate(reusable):
            for b in reusable[i + 1:]:
                if b.offset >= a.offset + a.slot_bytes:
                    break
                out.append((a, b, min(a.offset + a.slot_bytes, b.offset + b.slot_bytes) - b.offset))
        return out

    def live_overlaps(self) -> list[tuple[str, str]]:
        """Pairs of tensors sharing bytes while both live; empty for a correct plan."""
        self._require_final("live_overlaps")
        return live_overlaps(self._tensors, self.lifetimes if self.reuse else {})

    def with_shapes(self, shapes: Mapping[int | str, tuple[int, ...]], name: str) -> "MemoryPlan":
        """A variant plan: same tensors, same offsets, other shapes (each must fit its slot).
        ``shapes`` maps tensor ids or names to new shapes; tensors not named keep theirs."""
        self._require_final("with_shapes")
        if not isinstance(shapes, Mapping):
            raise bad_argument(PlanError, "with_shapes", "shapes", shapes, "a dict {tensor id or name: shape}",
                               "pass e.g. {0: (32, 784)}")
        by_id: dict[int, tuple[int, ...]] = {}
        for k, s in shapes.items():
            tid = self[k].id
            if tid in by_id:  # one tensor by its id and its name
                raise bad_argument(PlanError, "with_shapes", "shapes", dict(shapes), "each tensor once",
                                   f"tensor {self[k].name!r} (#{tid}) is given twice: keep one entry")
            by_id[tid] = _check_shape(s, f"with_shapes[{k!r}]")
        other = MemoryPlan(name)
        other.__dict__.update({k: v for k, v in self.__dict__.items() if k != "_tensors"})
        other.name = name
        tensors = []
        for t in self._tensors:
            s = tuple(by_id.get(t.id, t.shape))
            v = t.with_shape(s)
            if v.storage_bytes > t.slot_bytes:
                raise PlanError(f"with_shapes: {t.name} needs {v.storage_bytes} bytes in variant {name!r} "
                                f"but its slot holds {t.slot_bytes}. Fix: size slots by the largest variant.")
            tensors.append(v)
        other._tensors = tensors
        return other

    def _require_final(self, op: str) -> None:
        if not self.finalized:
            raise PlanError(f"{op}: the plan {self.name!r} is not finalized yet. Fix: call finalize() first.")

    # ---- display --------------------------------------------------------------------
    def summary(self) -> str:
        """A short table of the arena by family."""
        if not self.finalized:
            return f"MemoryPlan {self.name!r}: {plural(len(self), 'tensor')}, not finalized"
        arena = (bytes_versus(self.total_bytes, self.bytes_without_reuse, "without liveness reuse") if self.reuse
                 else human_bytes(self.total_bytes))
        lines = [f"MemoryPlan {self.name!r}: {plural(len(self), 'tensor')}, arena {arena}"]
        for fam, n in self.family_bytes().items():
            lines.append(f"  {fam}  {human_bytes(n):>10}  {FAMILIES[fam]}")
        padded = [t for t in self._tensors if t.pitch is not None]
        if padded:
            extra = sum(t.storage_bytes - t.nbytes for t in padded)
            lines.append(f"  rows padded (4 KiB rows alias in the cache): {plural(len(padded), 'tensor')}, "
                         f"+{human_bytes(extra)}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        if not self.finalized:
            return f"<MemoryPlan {self.name!r}: {plural(len(self), 'tensor')}, not finalized>"
        used = sum(1 for s in self.regions.values() if s.size)
        return (f"<MemoryPlan {self.name!r}: {plural(len(self), 'tensor')} in {plural(used, 'region')}, "
                f"arena {human_bytes(self.total_bytes)}, alignment {ALIGNMENT} B"
                + (f", liveness reuse saves {human_bytes(self.bytes_without_reuse - self.total_bytes)}>"
                   if self.reuse else ">"))
