"""Document-masked attention over packed blocks computes what each example alone would."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ghsweep.train import dolly_data as dolly
from ghsweep.train import packed_attention as attn
from ghsweep.train.loss import causal_lm_loss
from ghsweep.train.tokenizer import ByteTokenizer
from tests.support.models import TINY_LLAMA

TOK = ByteTokenizer()


def _model(implementation: str, dtype: torch.dtype, device: str) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        **TINY_LLAMA,
        vocab_size=TOK.vocab_size,
        use_cache=False,
        attn_implementation=implementation,
    )
    return LlamaForCausalLM(config).to(device=device, dtype=dtype)


def _examples(n: int) -> list[tuple[list[int], list[int]]]:
    return [dolly.tokenize(r, TOK) for r in dolly.synthetic_dolly(n, seed=11, mean_tokens=60, max_tokens=90)]


def _token_loss_sum(model, ids, labels, **kwargs) -> tuple[torch.Tensor, int]:
    hidden = model.model(input_ids=ids, use_cache=False, **kwargs)[0]
    count = int((labels[:, 1:] != dolly.IGNORE_INDEX).sum())
    return causal_lm_loss(hidden, model.lm_head.weight, labels).float() * count, count


def _packed_and_alone(implementation: str, dtype: torch.dtype, device: str, packing_mask: str = "document"):
    """(loss of the packed block, loss of the same examples one by one, unpacked)."""
    examples = _examples(4)
    blocks = dolly.pack(iter(examples), seq_length=sum(len(e[0]) for e in examples) + 5, pad_id=TOK.pad_token_id)
    assert len(blocks) == 1
    batch = {
        "input_ids": blocks.input_ids.to(device),
        "labels": blocks.labels.to(device),
        "position_ids": blocks.position_ids.to(device),
    }
    packed_attention = attn.PackedAttention(implementation, packing_mask)
    model = _model(packed_attention.hf_implementation, dtype, device)
    with torch.no_grad(), packed_attention.region():
        total, count = _token_loss_sum(
            model,
            batch["input_ids"],
            batch["labels"],
            **packed_attention.decoder_kwargs(batch["position_ids"], blocks.position_ids),
        )
        alone_model = _model("sdpa", dtype, device)
        alone = [
            _token_loss_sum(alone_model, torch.tensor([ids], device=device), torch.tensor([labels], device=device))
            for ids, labels in examples
        ]
    assert count == sum(c for _, c in alone)
    return (total / count).item(), (sum(t for t, _ in alone) / count).item()


def test_document_masking_equals_examples_trained_one_by_one_on_cpu():
    packed, alone = _packed_and_alone("sdpa", torch.float32, "cpu")
    assert packed == pytest.approx(alone, rel=1e-5)


def test_causal_packing_lets_examples_see_each_other():
    packed, alone = _packed_and_alone("sdpa", torch.float32, "cpu", packing_mask="causal")
    assert abs(packed - alone) / alone > 5e-5  # ten times what the equality test above allows


@pytest.mark.gpu
def test_flex_document_masking_equals_examples_one_by_one_on_gpu():
    packed, alone = _packed_and_alone("flex", torch.bfloat16, "cuda")
    assert packed == pytest.approx(alone, rel=2e-2)
    packed32, alone32 = _packed_and_alone("flex", torch.float32, "cuda")
    assert packed32 == pytest.approx(alone32, rel=1e-4)


@pytest.mark.gpu
def test_block_mask_built_on_the_host_is_the_one_built_on_the_gpu():
    # The training loop builds the mask from the host's copy of the positions and moves it in one copy.
    docs = _random_packing(torch.Generator().manual_seed(3), 2, 1500, 300)
    from_host = attn.document_block_mask(docs, torch.device("cuda"))
    on_gpu = attn.document_block_mask(docs.cuda())
    for name in [
        f"{kind}{side}_{part}" for kind in ("", "full_") for side in ("kv", "q") for part in ("num_blocks", "indices")
    ]:
        made, expected = getattr(from_host, name), getattr(on_gpu, name)
        assert made.is_cuda and made.dtype == torch.int32 and made.is_contiguous(), name
        assert torch.equal(made, expected), name
    assert torch.equal(from_host.to_dense(), on_gpu.to_dense())


def test_auto_picks_flex_for_documents_on_a_gpu_only():
    assert attn.resolve("auto", "document", "cuda") == "flex"
    assert attn.resolve("auto", "document", "cpu") == "sdpa"
    assert attn.resolve("auto", "causal", "cuda") == "sdpa"
    assert attn.resolve("cudnn", "document", "cuda") == "cudnn"


def test_document_ids_restart_at_each_example():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    assert attn.document_ids(positions).tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 2]]


def test_attended_keys_count_only_each_tokens_own_example():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 7]])
    # Row 1: examples of 3, 2, 3 tokens -> (9 + 4 + 9) / 8; row 2: one example of 8 -> 64 / 8.
    assert attn.attended_keys_per_token(positions, document=True) == pytest.approx((22 + 64) / 16)
    assert attn.attended_keys_per_token(positions, document=False) == 8.0


def _random_packing(generator: torch.Generator, rows: int, seq: int, mean_example: int) -> torch.Tensor:
    """Document ids of `rows` packed rows of `seq` tokens, examples starting at random."""
    starts = torch.rand(rows, seq, generator=generator) < 1 / mean_example
    starts[:, 0] = True
    return starts.long().cumsum(-1) - 1


@pytest.mark.parametrize("seq", [1, 127, 128, 129, 700, 1024, 1500])
@pytest.mark.parametrize("mean_example", [1, 40, 300, 5000])
def test_document_block_mask_is_the_one_create_block_mask_makes(seq: int, mean_example: int):
    # The block mask is made from each tile's first and last document; create_block_mask evaluates the
    # mask function over every pair. Same tiles skipped, partial and full, same key tiles in the same order.
    from torch.nn.attention.flex_attention import create_block_mask

    docs = _random_packing(torch.Generator().manual_seed(seq * 7 + mean_example), 2, seq, mean_example)
    made = attn.document_block_mask(docs)
    expected = create_block_mask(
        lambda b, h, q, kv: (docs[b, q] == docs[b, kv]) & (q >= kv), 2, None, seq, seq, device="cpu"
    )
    # Key tiles per query tile (forward) and query tiles per key tile (backward), partial and full.
    for kind, side in itertools.product(("", "full_"), ("kv", "q")):
        counts = getattr(made, f"{kind}{side}_num_blocks")
        assert torch.equal(counts, getattr(expected, f"{kind}{side}_num_blocks")), (kind, side)
        indices, expected_indices = getattr(made, f"{kind}{side}_indices"), getattr(expected, f"{kind}{side}_indices")
        for b, tile in itertools.product(range(2), range(counts.shape[-1])):
            n = int(counts[b, 0, tile])
            assert torch.equal(indices[b, 0, tile, :n], expected_indices[b, 0, tile, :n]), (kind, side, b, tile)
    assert torch.equal(made.to_dense(), expected.to_dense())
    assert (made.seq_lengths, made.BLOCK_SIZE) == (expected.seq_lengths, expected.BLOCK_SIZE)


@pytest.mark.cli  # torch.compile runs the C++ compiler
def test_flex_block_mask_equals_examples_one_by_one_on_cpu():
    # FlexAttention has a CPU forward (no backward): enough to check the document block mask itself.
    packed, alone = _packed_and_alone("flex", torch.float32, "cpu")
    assert packed == pytest.approx(alone, rel=1e-5)
