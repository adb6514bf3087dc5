"""fusedattn as a transformers attention implementation, on a tiny random Llama (no downloads):
logits and one training step's gradients match the sdpa implementation."""
from __future__ import annotations

import pytest
import torch

from conftest import DEVICES, DTYPES

transformers = pytest.importorskip("transformers")

import fusedattn.hf  # noqa: E402

VOCAB = 128


def tiny_llama_pair(device, dtype, **config_overrides):
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=256, **config_overrides)
    fusedattn.hf.register()
    reference = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    ours = transformers.LlamaForCausalLM._from_config(config, attn_implementation="fusedattn")
    ours.load_state_dict(reference.state_dict())
    return reference.to(device=device, dtype=dtype), ours.to(device=device, dtype=dtype)


def tolerances(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_logits_and_gradients_match_sdpa(device):
    dtype = DTYPES[device][0]
    reference, ours = tiny_llama_pair(device, dtype)
    input_ids = torch.randint(0, VOCAB, (2, 48), device=device)
    results = []
    for model in (reference, ours):
        model.train()
        out = model(input_ids=input_ids, labels=input_ids)
        out.loss.backward()
        results.append((out.logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (ref_logits, ref_grads), (logits, grads) = results
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits, ref_logits, **tolerances(dtype))
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], **tolerances(dtype), msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_padded_batch_matches_sdpa(device):
    """A left-padded batch (2-D padding mask) runs as packed variable-length sequences."""
    dtype = DTYPES[device][0]
    reference, ours = tiny_llama_pair(device, dtype)
    input_ids = torch.randint(0, VOCAB, (3, 20), device=device)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :7] = 0
    attention_mask[2, :1] = 0
    with torch.no_grad():
        ref = reference(input_ids=input_ids, attention_mask=attention_mask).logits
        got = ours(input_ids=input_ids, attention_mask=attention_mask).logits
    real = attention_mask.bool()  # padded positions' logits are meaningless in both
    torch.testing.assert_close(got[real], ref[real], **tolerances(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_packed_sequences_stay_apart(device):
    """Padding-free batches (sequences packed into one row, as DataCollatorWithFlattening makes):
    restarting position_ids, or transformers' cu_seq_lens/max_length keyword arguments, keep each
    sequence to itself, as each run alone."""
    dtype = DTYPES[device][0]
    reference, ours = tiny_llama_pair(device, dtype)
    lengths = [5, 11, 8]
    docs = [torch.randint(0, VOCAB, (1, n), device=device) for n in lengths]
    input_ids = torch.cat(docs, dim=1)
    position_ids = torch.cat([torch.arange(n, device=device) for n in lengths])[None]
    cu = torch.tensor([0, 5, 16, 24], dtype=torch.int32, device=device)
    with torch.no_grad():
        from_positions = ours(input_ids=input_ids, position_ids=position_ids).logits
        # Without position_ids (0..23 then: rotary embeddings are relative, so each sequence's
        # scores are as alone) the keyword arguments alone must keep the sequences apart.
        from_kwargs = ours(input_ids=input_ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths),
                           max_length_k=max(lengths)).logits
        alone = [reference(input_ids=doc).logits for doc in docs]
        unpacked = ours(input_ids=input_ids).logits  # one sequence of 24 tokens
    start = 0
    for n, want in zip(lengths, alone):
        torch.testing.assert_close(from_positions[:, start:start + n], want, **tolerances(dtype))
        torch.testing.assert_close(from_kwargs[:, start:start + n], want, **tolerances(dtype))
        start += n
    # The check can fail: read as one sequence, the later documents see the earlier ones.
    assert not torch.allclose(unpacked[:, 5:16], alone[1], **tolerances(dtype))


@pytest.mark.parametrize("kwargs, name", [(dict(softcap=30.0), "softcap"), (dict(s_aux=torch.zeros(4)), "s_aux"),
                                          (dict(dropout=0.1), "dropout")])
def test_unimplemented_arguments_raise_by_name(kwargs, name):
    """Arguments transformers may pass that the kernels do not implement raise, never vanish."""
    q = torch.randn(1, 4, 8, 16)

    class Module(torch.nn.Module):
        is_causal = True

    with pytest.raises(NotImplementedError, match=name):
        fusedattn.hf.attention_forward(Module(), q, q, q, None, **kwargs)
