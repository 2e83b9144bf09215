"""What a node reads and writes, its region-wide operands included: one place for their meaning.

A graph node lists tensor ids, but the ops that sweep whole regions (the optimizer over W, G, M and V,
the NaN check and gradient clipping over G, zero_grad, the EMA over E and the BN statistics) declare
only a flag or a counter; the kernels reach the rest through ``range_view(first, last)`` (see
kernels/operands.py: optimizer_ranges, ema_ranges). The views (lifetimes, atlas) and their tests read
the full set from here, so what is drawn is what the kernels touch.
"""
from __future__ import annotations

from typing import Any, Iterable

_PARAMS = {f: (f"{f}_BN_BIAS", f"{f}_DEEP_CONV") for f in "WGMVE"}
_BN_NEXT, _BN_PREV = ("B_NEXT_MEAN", "B_NEXT_VAR"), ("B_PREV_MEAN", "B_PREV_VAR")

Span = tuple[str, str]  # (first region, last region), as range_view takes them

RANGE_OPS: dict[str, tuple[tuple[Span | str, ...], tuple[Span | str, ...]]] = {
    # op: (regions read, regions written); "params" means the node's own first/last parameters
    "optimizer": ((_PARAMS["W"], _PARAMS["G"], _PARAMS["M"], _PARAMS["V"]),
                  (_PARAMS["W"], _PARAMS["M"], _PARAMS["V"])),
    "ema_update": ((_PARAMS["E"], _PARAMS["W"], _BN_NEXT, _BN_PREV), (_PARAMS["E"], _BN_NEXT)),
    "nan_check": (("params",), ()),
    "clip_grad_norm": (("params",), ("params",)),
    "zero_range": ((), ("params",)),
    "allreduce_mean": (("params",), ("params",)),
    "allreduce_start": ((), ()),  # its bucket's gradients are its inputs, reduced in place (below)
    "allreduce_wait": ((), ()),
}

COMM_OPS = ("allreduce_mean", "allreduce_start", "allreduce_wait")
"""The ops that all-reduce gradients over the ranks (kernels/comm.py): what they write is reduced."""


IN_PLACE_INPUTS: dict[str, tuple[int, ...]] = {
    "transfer": (0,),     # the cursor advances
    "transfer_image": (0,),  # likewise
    "transfer_image_async": (0,),  # likewise (prefetch: the CPU's background copy; the GPU's is the same)
    "dropout_fwd": (1,),  # the Philox offset advances
    "fc_bwd": (0,),       # dy: the activation's gradient is applied in place
    "fc_bwd_lowp": (0,),  # likewise (mixed precision's fc, kernels/fc_lowp.py)
    "conv_bwd": (0, 3),   # dy, likewise; cols, where the kernels make the columns again (tiles)
    "bn_bwd": (0,),       # dy, likewise
    "optimizer": (1,),    # the NaN flag is cleared after the update (by the EMA update instead, when one follows)
    "ema_update": (1,),   # likewise
    "allreduce_start": (0, 1),  # a bucket's gradients (weight, bias): summed over the ranks in place
    "allreduce_wait": (0, 1),   # likewise, then scaled by 1/ranks
}
"""Inputs an op's kernels also write: the graph lists them as inputs because they are read first."""


def region_spans(node: Any) -> tuple[list[Span], list[Span]]:
    """The (first, last) region spans a node reads and writes beyond its declared tensors; an op this
    table does not know that names a range (first/last parameters) reads and writes all of it."""
    default = (("params",), ("params",))
    reads, writes = RANGE_OPS.get(node.op, default)
    p = dict(node.params)

    def spans(items: Iterable[Span | str]) -> list[Span]:
        out = []
        for s in items:
            if s == "params":
                if "first" in p and "last" in p:
                    out.append((str(p["first"]), str(p["last"])))
            else:
                out.append(s)  # type: ignore[arg-type]
        return out

    return spans(reads), spans(writes)


def ids_in(plan: Any, spans: list[Span]) -> set[int]:
    """The tensors of a finalized MemoryPlan that lie in the byte ranges of ``spans``."""
    out: set[int] = set()
    for first, last in spans:
        try:
            a, b = plan.region_range(first, last)
        except Exception:  # a plan without that range (reserved regions): nothing there to touch
            continue
        out.update(t.id for t in plan if a <= t.offset < b and t.slot_bytes)
    return out


def in_place_inputs(node: Any) -> list[int]:
    """The ids among ``node``'s inputs that its kernels also write (IN_PLACE_INPUTS); none for a bn_bwd whose dy
    comes from a max pool (dy_pool: its first input is the pool's gradient, which it only reads)."""
    if "dy_pool" in dict(node.params):
        return []
    return [tid for k, tid in enumerate(node.inputs) if k in IN_PLACE_INPUTS.get(node.op, ())]


def reduced_ids(graph: Any, plan: Any) -> set[int]:
    """The tensors of ``plan`` that ``graph``'s COMM nodes all-reduce over the ranks (empty on one process)."""
    out: set[int] = set()
    for _, n in graph:
        if n.op in COMM_OPS:
            out |= node_access(n, plan)[1]
    return out


def node_access(node: Any, plan: Any) -> tuple[set[int], set[int]]:
    """(tensor ids read, tensor ids written) by ``node`` in ``plan``: declared ones, inputs written in
    place, and its region ranges."""
    r_spans, w_spans = region_spans(node)
    return (set(node.inputs) | ids_in(plan, r_spans),
            set(node.outputs) | set(in_place_inputs(node)) | ids_in(plan, w_spans))
