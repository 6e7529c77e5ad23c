"""Dolly records: prompt masking, packing, loading, and the data loader's workers."""

from __future__ import annotations

import json

import pytest
import torch

from ghsweep.train import dolly_data as dolly
from ghsweep.train.tokenizer import BpeTokenizer, ByteTokenizer, load_tokenizer
from tests.support.compose import compose_typed

TOK = ByteTokenizer()


def test_synthetic_records_have_dolly_fields_and_are_seeded():
    records = dolly.synthetic_dolly(50, seed=7)
    assert all(set(r) == set(dolly.DOLLY_FIELDS) for r in records)
    assert records == dolly.synthetic_dolly(50, seed=7)
    assert records != dolly.synthetic_dolly(50, seed=8)


def test_prompt_is_masked_and_response_learned():
    record = {"instruction": "Say hi.", "context": "", "response": "hi", "category": "open_qa"}
    ids, labels = dolly.tokenize(record, TOK)
    n_prompt = 1 + len(TOK.encode(dolly.prompt_text(record)))
    assert labels[:n_prompt] == [dolly.IGNORE_INDEX] * n_prompt
    assert labels[n_prompt:] == ids[n_prompt:] == [*TOK.encode("hi"), TOK.eos_token_id]
    assert TOK.decode(ids[1:n_prompt]).endswith("### Response:\n")


def test_context_appears_only_when_present():
    with_ctx = dolly.prompt_text({"instruction": "Q", "context": "C"})
    assert "### Context:\nC" in with_ctx
    assert "Context" not in dolly.prompt_text({"instruction": "Q", "context": ""})


def test_pack_fills_blocks_and_restarts_positions():
    examples = [([1, 2, 3], [-100, 2, 3]), ([4, 5], [-100, 5]), ([6, 7, 8, 9], [-100, -100, 8, 9])]
    blocks = dolly.pack(iter(examples), seq_length=6, pad_id=0)
    assert blocks.input_ids.tolist() == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 0, 0]]
    assert blocks.labels.tolist() == [[-100, 2, 3, -100, 5, -100], [-100, -100, 8, 9, -100, -100]]
    assert blocks.position_ids[0].tolist()[:5] == [0, 1, 2, 0, 1]
    assert blocks.dropped == 0


def test_pack_drops_examples_longer_than_a_block():
    blocks = dolly.pack(iter([([1] * 10, [1] * 10), ([2, 3], [2, 3])]), seq_length=4, pad_id=0)
    assert blocks.dropped == 1 and len(blocks) == 1


def test_pack_refuses_when_nothing_fits():
    with pytest.raises(ValueError, match="train.seq_length=4"):
        dolly.pack(iter([([1] * 10, [1] * 10)]), seq_length=4, pad_id=0)


def test_load_jsonl_round_trip_and_bad_record(tmp_path):
    records = dolly.synthetic_dolly(5, seed=1)
    path = tmp_path / "d.jsonl"
    dolly.write_dolly_jsonl(records, path)
    assert dolly.load_dolly_jsonl(path) == records
    assert len(dolly.load_dolly_jsonl(path, limit=2)) == 2
    path.write_text(json.dumps({"instruction": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"d.jsonl:1: record lacks \['response'\]"):
        dolly.load_dolly_jsonl(path)


@pytest.mark.cli  # the data loader's workers are processes
def test_num_workers_starts_worker_processes():
    examples = (dolly.tokenize(r, TOK) for r in dolly.synthetic_dolly(40, seed=3))
    blocks = dolly.pack(examples, seq_length=256, pad_id=TOK.pad_token_id)
    loader = dolly.make_dataloader(
        dolly.PackedDataset(blocks),
        2,
        seed=0,
        num_workers=2,
        pin_memory=False,
        prefetch_factor=2,
        persistent_workers=False,
    )
    iterator = iter(loader)
    batch = next(iterator)
    assert batch["input_ids"].shape == (2, 256) and batch["input_ids"].dtype == torch.long
    assert len(iterator._workers) == 2 and all(w.is_alive() for w in iterator._workers)
    del iterator


def test_synthetic_lengths_follow_the_documented_distribution():
    lengths = sorted(len(dolly.tokenize(r, TOK)[0]) for r in dolly.synthetic_dolly(3000, seed=4, mean_tokens=210))
    mean = sum(lengths) / len(lengths)
    p50, p90 = lengths[len(lengths) // 2], lengths[int(0.9 * len(lengths))]
    # The figures data.py's comment states: mean 235, p50 133, p90 459 (log-normal of mean 210 and
    # sigma 1, lifted at the short end by the prompt template).
    assert 220 <= mean <= 250 and 120 <= p50 <= 150 and 420 <= p90 <= 500
    assert max(lengths) > 900  # the long tail of long contexts
    short = [
        len(dolly.tokenize(r, TOK)[0]) for r in dolly.synthetic_dolly(500, seed=4, mean_tokens=210, max_tokens=128)
    ]
    assert max(short) <= 128 + 2  # BOS and EOS


def test_synthetic_lengths_are_in_the_tokenizers_tokens():
    class FourCharTokenizer:
        bos_token_id, eos_token_id = 1, 2

        def encode(self, text: str) -> list[int]:
            return [0] * ((len(text) + 3) // 4)

    tok = FourCharTokenizer()
    assert dolly.chars_per_token(tok) == pytest.approx(4, rel=0.01)
    records = dolly.synthetic_dolly(2000, seed=4, mean_tokens=210, chars_per_token=dolly.chars_per_token(tok))
    mean = sum(len(dolly.tokenize(r, tok)[0]) for r in records) / len(records)
    assert 195 <= mean <= 240  # four characters a token: the template weighs less than in bytes


def test_synthetic_records_refuse_a_block_no_record_fits():
    assert len(dolly.synthetic_dolly(20, seed=1, max_tokens=64)) == 20  # short tasks fit short blocks
    for seq in (8, 16):
        with pytest.raises(ValueError, match=f"train.seq_length={seq}"):
            dolly.synthetic_dolly(3, seed=1, max_tokens=seq)


@pytest.mark.cli  # the DataLoader's worker processes
def test_on_the_fly_builds_ahead_blocks_in_the_loaders_workers():
    """data.prepare=on_the_fly tokenises, masks and packs in the loader, in its workers: the batches (blocks,
    order, labels, positions) are ahead's for the same data and seed, and so are the FLOP-counting positions."""
    ahead = compose_typed("experiment=smoke", "data.num_examples=120", "data.tokenizer=bpe")
    on_the_fly = compose_typed("experiment=smoke", "data.num_examples=120", "data.prepare=on_the_fly")
    tokenizer = load_tokenizer(on_the_fly)
    assert isinstance(tokenizer, BpeTokenizer) and isinstance(load_tokenizer(ahead), BpeTokenizer)
    packed, lazy = dolly.load_dataset(ahead, tokenizer), dolly.load_dataset(on_the_fly, tokenizer)
    assert isinstance(packed, dolly.PackedDataset) and isinstance(lazy, dolly.OnTheFlyDataset)
    assert len(packed) == len(lazy) > 10 and packed.dropped == lazy.dropped
    assert torch.equal(packed.position_ids(), lazy.position_ids())

    def batches(dataset: dolly.BlockDataset, workers: int) -> list[dict[str, torch.Tensor]]:
        loader = dolly.make_dataloader(
            dataset, 2, seed=5, num_workers=workers, pin_memory=False, prefetch_factor=None, persistent_workers=False
        )
        return list(loader)

    expected = batches(packed, 0)
    for got in (batches(lazy, 0), batches(lazy, 2)):
        assert len(got) == len(expected)
        for a, b in zip(expected, got):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # Real subword tokens: fewer than the records' bytes, and they decode back to the text.
    record = lazy.records[lazy.plan.examples[0][0]]
    ids, _ = dolly.tokenize(record, tokenizer)
    assert len(ids) < len(dolly.tokenize(record, TOK)[0])
    assert tokenizer.decode(ids) == dolly.prompt_text(record) + record["response"]


def test_on_the_fly_tokenises_in_the_dataset_it_hands_the_loader():
    """What the loader's workers run: a block read twice is tokenised twice (nothing cached at start but
    the plan), so the work happens per step."""
    config = compose_typed("experiment=smoke", "data.num_examples=30", "data.prepare=on_the_fly")
    calls = []

    class CountingBpe(BpeTokenizer):
        def encode(self, text: str) -> list[int]:
            calls.append(text)
            return super().encode(text)

    dataset = dolly.OnTheFlyDataset(
        dolly.load_records(config.data, config.seed, config.train.seq_length, CountingBpe()),
        CountingBpe(),
        config.train.seq_length,
    )
    at_start = len(calls)
    assert torch.equal(dataset[0]["input_ids"], dataset[0]["input_ids"])
    # Two encodes (prompt, response) per record of block 0, each read.
    assert len(calls) - at_start == 2 * 2 * len(dataset.plan.examples[0])


def numbered_batches():
    """Micro-batches whose tokens say which block they are (block n: every token n)."""
    n = 0
    while True:
        yield {"input_ids": torch.full((1, 4), n)}
        n += 1


def blocks_trained(steps: int, window: range | None, replay: bool, window_known_at: int = 0):
    """Which block each step trains, and the fingerprint, when the window is known from step `window_known_at`
    on (a window that follows the measurement is known only once the measurement stopped)."""
    batches = dolly.CapturedBlocks(numbered_batches(), 2, replay)
    trained = [
        int(batches.batch(step, window if step >= window_known_at else None)["input_ids"][0, 0])
        for step in range(steps)
    ]
    return trained, batches.fingerprint


def test_an_auto_capture_window_trains_the_runs_first_blocks_again_wherever_it_falls():
    early, early_print = blocks_trained(8, range(6, 8), replay=True, window_known_at=6)
    late, late_print = blocks_trained(11, range(9, 11), replay=True, window_known_at=9)
    assert early == [0, 1, 2, 3, 4, 5, 0, 1] and late == [0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1]
    assert early_print == late_print is not None  # the same blocks captured: the same fingerprint


def test_a_window_at_a_chosen_step_or_over_the_first_blocks_trains_the_blocks_as_they_come():
    chosen, chosen_print = blocks_trained(6, range(3, 5), replay=False)
    assert chosen == [0, 1, 2, 3, 4, 5]
    first, first_print = blocks_trained(3, range(1, 3), replay=True)
    assert first == [0, 1, 2]  # the window began before blocks 0 and 1 were both trained
    auto, auto_print = blocks_trained(8, range(6, 8), replay=True, window_known_at=6)
    assert len({chosen_print, first_print, auto_print}) == 3  # blocks 3-4, 1-2 and 0-1


def test_an_uncaptured_run_has_no_fingerprint():
    trained, fingerprint = blocks_trained(4, None, replay=True)
    assert trained == [0, 1, 2, 3] and fingerprint is None
