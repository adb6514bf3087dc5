"""fusedattn for PyTorch: fused attention kernels behind flash_attn's Python API.

    import fusedattn
    out = fusedattn.flash_attn_func(q, k, v, causal=True)   # (batch, seqlen, heads, dim)

The raw operators are torch.ops.fusedattn.{fwd, bwd, varlen_fwd, varlen_bwd, append_kv,
merge_attention}. ring_flash_attn_func
(fusedattn.context_parallel) runs attention over a sequence sharded across a torch.distributed group.
fusedattn.masks builds column masks (flash_attn_func's column_mask) for packed documents and
prefix-LM attention; fusedattn.bert_padding has flash_attn.bert_padding's unpad_input and
pad_input, fusedattn.rotary flash_attn.layers.rotary's apply_rotary_emb and RotaryEmbedding.
merge_attention(_) merges attention over disjoint key sets by their log-sum-exp (fusedattn.merge).
"""
from . import bert_padding, masks, rotary
from ._ops import ops
from .context_parallel import ring_flash_attn_func
from .merge import merge_attention, merge_attention_
from .flash_attn_interface import (
    attention,
    check_device_errors,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

__version__ = "0.1.0"

__all__ = [
    "attention",
    "bert_padding",
    "check_device_errors",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "masks",
    "merge_attention",
    "merge_attention_",
    "ops",
    "ring_flash_attn_func",
    "rotary",
]
