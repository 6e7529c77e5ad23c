"""The 7B LoRA line profiled twice in one sweep on an H200 (tests/data/profiles/h200_7b_repeats):
repeats get the same findings, a repeat the profiler slowed says so first, and the step delta of fp8
against bf16 names the GEMMs that went and came, with the profiler's share kept apart."""

from __future__ import annotations

import gzip
import json
import sqlite3
import statistics
from pathlib import Path

import pytest

from ghsweep.profile.delta import OTHER_BLOCKS, because, render, step_delta
from ghsweep.profile.overhead import MeasuredRun
from ghsweep.profile.result import ProfileAnalysis
from ghsweep.profile.run_analysis import full_analysis
from ghsweep.train import dolly_data as dolly
from ghsweep.train.packed_attention import document_block_mask, document_ids
from ghsweep.train.tokenizer import ByteTokenizer
from tests.support.compose import compose_typed

DATA = Path(__file__).resolve().parents[1] / "data" / "profiles" / "h200_7b_repeats"
MEASURED = json.loads((DATA / "measured.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, ProfileAnalysis]:
    folder = tmp_path_factory.mktemp("h200_7b_repeats")
    out = {}
    for name, measured in MEASURED.items():
        sqlite = folder / f"{name}.sqlite"
        sqlite.write_bytes(gzip.decompress((DATA / name / "profile_rank0.sqlite.gz").read_bytes()))
        out[name] = full_analysis(sqlite, measured=MeasuredRun(step_ms=measured["measured_step_ms"]))
    return out


def test_the_repeats_of_bf16_get_the_same_findings(runs):
    first, second = runs["bf16_1"], runs["bf16_2"]
    # Two steady traced steps each (the capture's first is warm-up): their means are 2.2% apart, the
    # runs' untraced steps 0.4%.
    assert first.profiled_step_ms == pytest.approx(second.profiled_step_ms, rel=0.025)
    assert [(f.id, f.severity) for f in first.findings] == [(f.id, f.severity) for f in second.findings]


def test_the_repeat_the_profiler_slowed_says_so_first_and_the_rest_as_its_twin(runs):
    slowed, clean = runs["fp8_2"], runs["fp8_1"]
    for analysis, name in ((slowed, "fp8_2"), (clean, "fp8_1")):
        # The sweep's analysis at capture counted the capture's first step as steady too: within 1.5 points.
        assert analysis.profiler_overhead_pct == pytest.approx(
            MEASURED[name]["profiler_overhead_pct_at_capture"], abs=1.5
        )
    assert slowed.profiler_overhead_pct > 20 and slowed.findings[0].id == "profiler_overhead"
    assert abs(clean.profiler_overhead_pct) < 5 and "profiler_overhead" not in [f.id for f in clean.findings]
    # Net of the profiler, the slowed repeat's idle time is its twin's: no idle finding of its own.
    assert [f.id for f in slowed.findings[1:]] == [f.id for f in clean.findings]


def test_fp8_against_bf16_names_the_gemms_and_keeps_the_profilers_share_apart(runs):
    clean = step_delta(runs["bf16_1"], runs["fp8_1"])
    slowed = step_delta(runs["bf16_1"], runs["fp8_2"])
    for d in (clean, slowed):
        assert sum(d["parts"].values()) == pytest.approx(d["difference_ms"], abs=1e-6)
        families = {f["family"]: f["delta_ms"] for f in d["by_family"]}
        assert families["bf16 GEMMs"] < -100 and families["fp8 GEMMs"] > 50
    # The traced differences are 34 ms apart; the profiler's part holds that, and what is left (the
    # measured difference) agrees between the repeats within a millisecond.
    assert slowed["difference_ms"] - clean["difference_ms"] > 30
    assert slowed["parts"]["profiler_overhead_ms"] - clean["parts"]["profiler_overhead_ms"] > 30
    assert slowed["measured_difference_ms"] == pytest.approx(clean["measured_difference_ms"], abs=1.0)


# The steps each repeat's capture window held (after its measurement stopped), as its NVTX ranges say.
CAPTURED = {"bf16_1": range(40, 43), "bf16_2": range(30, 33), "fp8_1": range(12, 15), "fp8_2": range(20, 23)}


def step_kernel_ms(sqlite: Path, contains: str) -> dict[int, float]:
    """Per captured step (its NVTX range on the host), the time of the kernels it launched whose name has `contains`."""
    with sqlite3.connect(sqlite) as db:
        steps = db.execute("SELECT start, end, text FROM NVTX_EVENTS WHERE text LIKE 'step %'").fetchall()
        kernels = db.execute(
            "SELECT k.end - k.start, r.start, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
            "JOIN StringIds s ON s.id = k.shortName"
        ).fetchall()
    return {
        int(text.split()[1]): sum(ns for ns, launched, name in kernels if start <= launched <= end and contains in name)
        / 1e6
        for start, end, text in steps
    }


@pytest.fixture(scope="module")
def blocks_of_the_line() -> list[dict]:
    """The blocks the line's runs trained, step by step: the 7B line's data (seed, dolly_synthetic, 4096)."""
    config = compose_typed("model=llama2_7b", "train.seq_length=4096", "train.micro_batch_size=1")
    loader = dolly.make_dataloader(dolly.load_dataset(config, ByteTokenizer()), 1, config.seed, 0, False, None, False)
    batches = dolly.endless(loader)
    return [next(batches) for _ in range(max(r.stop for r in CAPTURED.values()))]


def tiles(batch: dict) -> int:
    """FlexAttention's computed tiles of 128 x 128 (partial and full) for the batch's document mask."""
    mask = document_block_mask(document_ids(batch["position_ids"]))
    return int(mask.kv_num_blocks.sum() + mask.full_kv_num_blocks.sum())


def test_attention_a_captured_step_follows_its_blocks_documents(tmp_path, blocks_of_the_line):
    """Why the repeats' attention differed (12.3-25.2 ms a step with the same kernels, fp8 or bf16): their
    windows held other blocks. Per captured step, attention's kernel time against the block's computed tiles."""
    points = []
    for name, window in CAPTURED.items():
        sqlite = tmp_path / f"{name}.sqlite"
        sqlite.write_bytes(gzip.decompress((DATA / name / "profile_rank0.sqlite.gz").read_bytes()))
        attention = step_kernel_ms(sqlite, "flex_attention")
        assert sorted(attention) == list(window)
        points += [(tiles(blocks_of_the_line[step]), attention[step]) for step in window]
    by_tiles = sorted(points)
    assert by_tiles[0][0] == 73 and by_tiles[-1][0] == 221  # fp8_1's step 14 and fp8_2's step 22
    assert by_tiles[-1][1] > 1.9 * by_tiles[0][1]  # 2.9x the tiles: 25.2 against 12.7 ms
    # Attention's time rises with the tiles: a line through the points explains most of its spread.
    assert statistics.correlation([t for t, _ in points], [a for _, a in points]) > 0.9


def test_a_delta_between_runs_that_profiled_other_blocks_says_so(runs, blocks_of_the_line):
    def fingerprint(window: range) -> str | None:
        captured = dolly.CapturedBlocks(iter(blocks_of_the_line), len(window), replay=False)
        for step in range(window.stop):
            captured.batch(step, window)
        return captured.fingerprint

    bf16, fp8 = runs["bf16_1"], runs["fp8_1"]
    bf16.captured_blocks, fp8.captured_blocks = fingerprint(CAPTURED["bf16_1"]), fingerprint(CAPTURED["fp8_1"])
    d = step_delta(bf16, fp8)
    assert d["same_blocks"] is False
    assert OTHER_BLOCKS in render(d)
    assert because(d, families=7).endswith("attention -5 µs (other blocks profiled)")
    fp8.captured_blocks = bf16.captured_blocks
    assert step_delta(bf16, fp8)["same_blocks"] is True and OTHER_BLOCKS not in render(step_delta(bf16, fp8))
