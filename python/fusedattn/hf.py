"""Hugging Face transformers integration: fusedattn as an attention implementation.

    import fusedattn.hf
    fusedattn.hf.register()                       # registers "fusedattn"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="fusedattn")

transformers hands the attention function (batch, heads, seqlen, head_dim) tensors and expects
(batch, seqlen, heads, head_dim) back, which is exactly flash_attn_func's layout seen through a
transpose view: nothing is copied. Padding masks and padding-free (packed) batches are handled the
way transformers' flash-attention path does it: the 2-D mask selects the real tokens, which run as
a packed variable-length batch; without a mask, sequences packed into one row run as a
variable-length batch of their own, from the cu_seq_lens_q/k and max_length_q/k keyword arguments
(DataCollatorWithFlattening(return_flash_attn_kwargs=True)) or else from position_ids that restart
within the row (each restart begins a sequence; reading them waits for the stream, as in
transformers).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .flash_attn_interface import flash_attn_func, flash_attn_varlen_func

DEFAULT_NAME = "fusedattn"


def _cu_seqlens(token_mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    lengths = token_mask.sum(dim=1, dtype=torch.int32)
    return F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0)), int(lengths.max())


def _padded_attention(query, key, value, padding_mask, scale, causal, window):
    # query/key/value: (batch, seqlen, heads, dim) views; padding_mask: (batch, seqlen_k), True = token.
    batch, seqlen_q, heads, dim = query.shape
    q_mask = padding_mask[:, -seqlen_q:]
    q_rows = q_mask.flatten().nonzero().squeeze(1)
    k_rows = padding_mask.flatten().nonzero().squeeze(1)
    cu_q, max_q = _cu_seqlens(q_mask)
    cu_k, max_k = _cu_seqlens(padding_mask)
    packed = flash_attn_varlen_func(
        query.reshape(-1, heads, dim)[q_rows], key.reshape(-1, *key.shape[2:])[k_rows],
        value.reshape(-1, *value.shape[2:])[k_rows], cu_q, cu_k, max_q, max_k, softmax_scale=scale,
        causal=causal, window_size=window)
    out = packed.new_zeros(batch * seqlen_q, heads, dim).index_copy(0, q_rows, packed)
    return out.view(batch, seqlen_q, heads, dim)


def _packed_sequences(batch, kwargs):
    """(cu_seqlens_q, cu_seqlens_k, max_q, max_k) of sequences packed into the rows, or None: from
    transformers' varlen keyword arguments, else from position_ids restarting within one row
    (transformers' _is_packed_sequence and prepare_fa_kwargs_from_position_ids)."""
    names = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
    given = [kwargs.get(n) for n in names]
    if all(x is not None for x in given):
        cu_q, cu_k, max_q, max_k = given
        return cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k)
    position_ids = kwargs.get("position_ids")
    # Only one row of plain positions: multimodal rotary positions (e.g. (3, batch, seqlen)) are
    # not sequence starts.
    if position_ids is None or batch != 1 or position_ids.dim() != 2 or position_ids.shape[0] != 1:
        return None
    if position_ids.shape[-1] == 1:
        return None
    positions = position_ids.reshape(-1)
    first = positions.min()
    if torch.equal(positions, torch.arange(positions.numel(), device=positions.device) + first):
        return None  # one sequence
    starts = (positions == first).nonzero().view(-1).to(torch.int32)
    cu = torch.cat([starts, torch.tensor([positions.numel()], dtype=torch.int32, device=positions.device)])
    longest = int(cu.diff().max())
    return cu, cu, longest, longest


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
                      sliding_window: Optional[int] = None, is_causal: Optional[bool] = None, **kwargs):
    """The function transformers calls for attn_implementation="fusedattn"; returns (output, None)."""
    if kwargs.get("softcap"):
        raise NotImplementedError("fusedattn: softcap: logit soft-capping is not implemented")
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("fusedattn: s_aux: attention sinks (learned per-head logits) are not implemented")
    if dropout:
        raise NotImplementedError("fusedattn: dropout: attention dropout is not implemented")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # transformers' sliding_window counts the current token; flash_attn's window does not.
    window = (sliding_window - 1, sliding_window - 1) if sliding_window else (-1, -1)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if attention_mask is not None and attention_mask.dim() != 2:
        raise NotImplementedError(
            "fusedattn: attention_mask: only 2-D padding masks are supported; register the attention "
            "with fusedattn.hf.register() so transformers builds that kind of mask")
    packed = _packed_sequences(q.shape[0], kwargs) if attention_mask is None else None
    if packed is not None:
        cu_q, cu_k, max_q, max_k = packed
        batch, seqlen_q, heads, dim = q.shape
        rows = flash_attn_varlen_func(q.reshape(-1, heads, dim), k.reshape(-1, *k.shape[2:]),
                                      v.reshape(-1, *v.shape[2:]), cu_q, cu_k, max_q, max_k, softmax_scale=scaling,
                                      causal=causal, window_size=window)
        out = rows.view(batch, seqlen_q, heads, dim)
    elif attention_mask is None:
        out = flash_attn_func(q, k, v, softmax_scale=scaling, causal=causal, window_size=window)
    else:
        out = _padded_attention(q, k, v, attention_mask.bool(), scaling, causal, window)
    return out, None


def register(name: str = DEFAULT_NAME) -> None:
    """Registers the attention function and its mask builder with transformers under `name`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, attention_forward)
    # The flash-attention mask builder yields None without padding (causal is then a kernel flag)
    # and the 2-D padding mask otherwise, never a dense (seqlen_q x seqlen_k) mask.
    AttentionMaskInterface.register(name, flash_attention_mask)
