"""The C library's entries and their ctypes signatures: native_build.py declares them on each loaded part,
kernels/thunks.py generates the native program's thunk of each (program.c), program.py reads an op's
argument kinds here. One table per C source, the order of the arguments as the C function takes them; CORE
holds the core part's entries (the library's first part, kernels/native_build.py PARTS), GPT_LOWP the other's."""
from __future__ import annotations

import ctypes
from ctypes import c_double, c_float, c_int, c_int64, c_void_p
from typing import Any

P, I64, F64, F32, INT = c_void_p, c_int64, c_double, c_float, c_int
Signature = tuple[Any, tuple[Any, ...]]
CORE: dict[str, Signature] = {
    "rnb_abi": (INT, ()),
    "rnb_chunks": (INT, ()),
    "rnb_bias_act": (None, (P, I64, I64, I64, P, I64, I64, F64, INT)),
    "rnb_act_grad_colsum": (None, (P, I64, I64, I64, P, I64, I64, F64, P, I64, P, I64, INT)),
    "rnb_adam": (None, (P, P, P, P, I64, P, I64, P, F64, F64, F64, F64, INT, INT, INT)),
    "rnb_count_back": (None, (P,)),
    "rnb_sgd": (None, (P, P, P, I64, I64, P, I64, P, F64, F64, F64, INT, INT, INT)),
    "rnb_ema": (None, (P, P, I64, F64)),
    "rnb_lars_norms": (None, (P, P, P, P, I64, INT)),
    "rnb_lars": (None, (P, P, P, I64, P, P, I64, P, I64, P, F64, F64, F64, F64, INT)),
    "rnb_nonfinite_probe": (F32, (P, I64, P, INT)),
    "rnb_sq_sum": (F64, (P, I64, INT)),
    "rnb_scale": (None, (P, I64, F32, INT)),
    "rnb_gather": (I64, (P, I64, I64, I64, P, I64, P, I64, P, P, P, I64, INT)),
    "rnb_softmax_xent": (None, (P, I64, I64, I64, P, INT, F64, P, I64, P, P, I64, INT)),
    "rnb_accumulate_metrics": (None, (P, P, F64, P, I64, P)),
    "rnb_gemm_bands": (None, (P, INT, P, I64, INT)),
    "rnb_philox_keys": (None, (P, I64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                                ctypes.c_uint64)),
    "rnb_run_steps": (I64, (P, I64, I64, I64, P, INT)),
    "rnb_copy_bytes": (None, (P, P, I64)),
    "rnb_zero_bytes": (None, (P, I64)),
    "rnb_ema_warm": (None, (P, P, I64, P, F64)),
    "rnb_clip_norm": (None, (P, I64, P, F32, INT)),
}
U64 = ctypes.c_uint64
CORE.update({  # conv_native.c and winograd_native.c: the conv nets' kernels (kernels/conv_native.py binds them)
    "rnb_bn_fwd": (None, (P, I64, I64, I64, P, P, P, I64, P, P, P, P, F64, F64, I64, P, P, P, I64, INT)),
    "rnb_bn_bwd": (None, (P, I64, I64, I64, P, I64, P, I64, P, P, P, P, I64, P, P, I64, P, P, P, I64, INT, P, P, P, I64, I64,
                               I64)),
    "rnb_bn_fold": (None, (P, P, P, P, I64, F64, P, P)),
    "rnb_channel_affine": (None, (P, I64, I64, I64, P, P, P, I64, I64, INT)),
    "rnb_maxpool_fwd": (None, (P, P, I64, I64, I64, I64, P, P, I64, I64, I64, I64, I64, INT, INT)),
    "rnb_maxpool_bwd": (None, (P, P, P, P, I64, I64, I64, I64, I64, I64, INT, INT)),
    "rnb_avgpool": (None, (P, I64, I64, I64, I64, P, I64, I64, I64, I64, I64, F32, INT, INT)),
    "rnb_gap": (None, (P, I64, I64, I64, P, I64, F32, INT, INT)),
    "rnb_patches": (None, (P, I64, I64, I64, I64, P, I64, I64, I64, I64, I64, INT, INT)),
    "rnb_im2col_taps": (None, (P, I64, I64, I64, P, P, I64, I64, I64, I64, I64, INT)),
    "rnb_relu": (None, (P, P, P, I64, INT)),
    "rnb_gather_images": (I64, (P, I64, I64, I64, I64, P, INT, P, I64, P, P, P, P, I64, I64, I64, U64, U64, U64, I64,
                                I64, F64, P, P, P, P, P, P, P, P, INT, INT)),
    "rnb_claim_batch": (None, (P, P, I64, P)),
    "rnb_dropout_fwd": (None, (P, P, P, I64, P, U64, U64, U64, F32, F32, INT)),
    "rnb_mul": (None, (P, P, P, I64, INT)),
    "rnb_add": (None, (P, P, P, I64, INT, INT)),
    "rnb_conv_fwd_tiles": (None, (P, INT, P, I64, I64, I64, I64, P, I64, P, P, I64, I64, I64, I64, I64, I64, I64, P,
                                  I64, I64)),
    "rnb_conv_bwd_tiles": (None, (P, INT, P, I64, I64, I64, I64, P, P, I64, P, P, P, P, P, I64, I64, I64, I64, I64,
                                  I64, I64)),
    "rnb_winograd_fwd": (None, (P, INT, P, INT, P, P, I64, I64, I64, I64, P, I64, P, I64, I64, P, I64, I64, I64, I64)),
    "rnb_winograd_dw": (None, (P, INT, P, I64, I64, I64, I64, P, I64, P, P, I64, I64, I64, I64)),
})
GPT_LOWP: dict[str, Signature] = {  # lowp.c: mixed precision's conversions and GEMMs (kernels/lowp.py binds them)
    "rnb_lowp_built": (INT, ()),
    "rnb_lowp_convert": (INT, (INT, INT, P, I64, I64, I64, P, I64, INT, INT)),
    "rnb_lowp_unscale": (INT, (P, INT, I64, P, P, P, INT, INT)),
    "rnb_lowp_gemm_path": (INT, (INT, INT, INT)),
    "rnb_lowp_gemm_scratch": (I64, (INT, I64, I64, I64, INT)),
    "rnb_lowp_gemm": (INT, (INT, INT, INT, I64, I64, I64, P, I64, P, I64, INT, P, I64, INT, P, INT, P, I64, INT, INT,
                            INT)),
}
GPT_LOWP.update({  # gelu_native.c: GELU's two forms (kernels/gelu_native.py binds them)
    "rnb_gelu": (None, (P, P, P, I64, INT, INT)),
})
GPT_LOWP.update({  # gpt_native.c: the GPT's layer norm and embeddings (kernels/gpt_native.py binds them)
    "rnb_ln_fwd": (None, (P, I64, I64, P, P, P, P, P, F64, INT)),
    "rnb_ln_bwd": (None, (P, P, I64, I64, P, P, P, P, P, I64, P, P, INT)),
    "rnb_embed_fwd": (None, (P, I64, P, I64, P, INT)),
    "rnb_embed_bwd": (None, (P, I64, P, I64, P, I64, P, INT)),
    "rnb_pos_fwd": (None, (P, I64, I64, I64, P, P, INT)),
    "rnb_pos_bwd": (None, (P, I64, I64, I64, P, I64, P, INT)),
    "rnb_div_f32": (None, (P, I64, F32)),
    "rnb_gather_windows": (I64, (P, P, I64, I64, I64, I64, P, I64, P, P, P, I64, I64)),
    "rnb_add_row_at": (None, (P, P, P, P, I64)),
    "rnb_attn_decode": (None, (P, P, P, P, P, P, I64, I64, I64, F64)),
})
_HEADS = (I64, I64, I64, I64)  # b, h, t, hd
GPT_LOWP.update({  # attention_native.c: causal self-attention (kernels/attention_native.py binds them)
    "rnb_attn_scores": (None, (P, P, P, P, P, P, *_HEADS, F64, INT)),
    "rnb_attn_mix": (None, (P, P, P, P, P, *_HEADS, INT)),
    "rnb_attn_mix_bwd": (None, (P, P, P, P, P, P, P, *_HEADS, INT)),
    "rnb_attn_scores_bwd": (None, (P, P, P, P, P, P, P, P, P, *_HEADS, F64, INT)),
    "rnb_flash_fwd": (None, (P, P, P, P, P, P, P, P, P, P, P, P, P, *_HEADS, I64, F64, INT)),
    "rnb_flash_bwd": (None, (P, P, P, P, P, P, P, P, P, P, P, P, P, P, P, P, P, P, *_HEADS, I64, F64, INT)),
})
SIGNATURES: dict[str, Signature] = {**CORE, **GPT_LOWP}
"""Every entry of the library, whichever part defines it."""
