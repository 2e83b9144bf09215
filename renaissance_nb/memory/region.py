"""The 68 named regions of the arena, in the original's address order.

A region is a named, contiguous range of the one arena. Its family (the prefix
before the first underscore) says what lives there; keeping W, G, M and V in the
same order with the same slot sizes is what makes whole-region optimizer updates
a single pass over memory.
"""
from __future__ import annotations

from enum import IntEnum


class Region(IntEnum):
    """Named arena regions, low address to high (same names and order as the original)."""

    # B: batch-norm running statistics (epoch lifetime)
    B_PREV_MEAN = 0
    B_PREV_VAR = 1
    B_NEXT_MEAN = 2
    B_NEXT_VAR = 3
    # W: main model weights
    W_EQ_BIAS = 4
    W_EQ_SCALE = 5
    W_BN_BIAS = 6
    W_BN_WEIGHT = 7
    W_FC_BIAS = 8
    W_FC_WEIGHT = 9
    W_FIRST_CONV = 10
    W_DEEP_CONV = 11
    # E: EMA copies of the weights
    E_BN_BIAS = 12
    E_BN_WEIGHT = 13
    E_FC_BIAS = 14
    E_FC_WEIGHT = 15
    E_FIRST_CONV = 16
    E_DEEP_CONV = 17
    E_FC_WEIGHT_FP16 = 18
    E_FIRST_CONV_FP16 = 19
    E_DEEP_CONV_FP16 = 20
    # A: 16-bit working weights for mixed precision (the original's names say FP16: bf16 or fp16 here)
    A_FC_WEIGHT = 21
    A_FIRST_CONV = 22
    A_DEEP_CONV = 23
    # G: gradients
    G_BN_BIAS = 24
    G_BN_WEIGHT = 25
    G_FC_BIAS = 26
    G_FC_WEIGHT = 27
    G_FIRST_CONV = 28
    G_DEEP_CONV = 29
    # R: per-batch result (loss, top-1, top-5)
    R_RESULT = 30
    G_FC_WEIGHT_FP16 = 31
    G_FIRST_CONV_FP16 = 32
    G_DEEP_CONV_FP16 = 33
    # M: first optimizer moments
    M_BN_BIAS = 34
    M_BN_WEIGHT = 35
    M_FC_BIAS = 36
    M_FC_WEIGHT = 37
    M_FIRST_CONV = 38
    M_DEEP_CONV = 39
    # V: second optimizer moments
    V_BN_BIAS = 40
    V_BN_WEIGHT = 41
    V_FC_BIAS = 42
    V_FC_WEIGHT = 43
    V_FIRST_CONV = 44
    V_DEEP_CONV = 45
    # N: LARS norms
    N_FC_WEIGHT = 46
    N_FIRST_CONV = 47
    N_DEEP_CONV = 48
    # I: double-buffered input data and labels
    I_A_LABEL = 49
    I_A_DATA = 50
    I_B_LABEL = 51
    I_B_DATA = 52
    # F: feature maps and gradient slots
    F_FEATURE_FP32 = 53
    F_GRAD_SLOT_FP32 = 54
    F_FEATURE_FP16 = 55
    F_GRAD_SLOT_FP16 = 56
    # S: scalars and masks
    S_SCALAR_FP32 = 57
    S_SCALAR_FP16 = 58
    S_SCALAR_INT32 = 59
    S_SCALAR_INT8 = 60
    S_MASK = 61
    # T: temporaries
    T_TEMP_FP32 = 62
    T_TEMP_FP16 = 63
    T_TEMP_INT32 = 64
    T_TEMP_INT8 = 65
    # R: predictions and accumulated metrics
    R_PREDICTED_LABEL = 66
    R_RESULT_ACCUMULATED = 67
    # sentinel: one past the last region (the original's NUM_REGIONS slot)
    END = 68

    @property
    def family(self) -> str:
        """The one-letter family (W, G, M, V, F, T, I, S, R, B, E, A, N)."""
        return self.name.split("_", 1)[0]

    @property
    def reusable(self) -> bool:
        """Whether liveness analysis may let tensors of this region share bytes.

        Feature maps, gradient slots and temporaries live for part of a step only;
        everything else (weights, moments, inputs, results, masks) carries state.
        """
        return self.family in ("F", "T")

    @property
    def reserved_for(self) -> str | None:
        """The feature of the original a reserved region belongs to (no model here fills it), else None."""
        return RESERVED.get(self)

    @property
    def record_shape(self) -> tuple[int, ...] | None:
        """The shape of the one record a parameter has here when the family keeps a fixed record per weight
        tensor instead of a copy of it (N: LARS's [||w||, ||g||]); None for the families shaped like W."""
        return RECORD_SHAPES.get(self.family)


NUM_REGIONS = 68
"""Named regions (the enum has one more slot: the END sentinel)."""

FAMILIES: dict[str, str] = {
    "B": "batch-norm running statistics",
    "W": "weights",
    "E": "EMA weights",
    "A": "16-bit working weights (mixed precision)",
    "G": "gradients",
    "M": "first moments",
    "V": "second moments",
    "N": "LARS norms",
    "I": "input buffers A/B",
    "F": "feature maps and gradient slots",
    "S": "scalars and masks",
    "T": "temporaries",
    "R": "results and metrics",
}

PARAM_FAMILIES: tuple[str, ...] = ("W", "E", "G", "M", "V")
"""The fp32 families holding one tensor per parameter, each laid out like W: the optimizer and
the EMA update run over them as flat ranges, element i of one matching element i of the others."""

# The parameter regions that W, G, M, V (and E) list in the same order.
PARAM_KINDS: tuple[str, ...] = ("BN_BIAS", "BN_WEIGHT", "FC_BIAS", "FC_WEIGHT", "FIRST_CONV", "DEEP_CONV")


def param_region(family: str, kind: str) -> Region:
    """The region of a parameter kind in a family, e.g. ('G', 'FC_WEIGHT') -> G_FC_WEIGHT."""
    return Region[f"{family}_{kind}"]


RECORD_SHAPES: dict[str, tuple[int, ...]] = {"N": (2,)}
"""Families holding one fixed-size record per weight tensor (``Region.record_shape``); they have regions only
for weights (N_FC_WEIGHT, N_FIRST_CONV, N_DEEP_CONV), so biases and batch-norm parameters get none."""

RESERVED: dict[Region, str] = {
    Region.S_SCALAR_FP16: "mixed precision: 16-bit scalars (the loss scale and the results stay fp32 here)",
    Region.R_PREDICTED_LABEL: "stored predictions (predict() takes the argmax of the logits instead)",
    Region.S_SCALAR_INT8: "int8 scalars (quantisation)",
    Region.T_TEMP_INT8: "int8 temporaries (quantisation)",
}
"""Regions of the original kept in the enum, with their place in the address order, that no model
of this library fills: the features they serve are not built. A plan never allocates in them."""
