"""train.gc_interval and the collections' pauses: each pause is put in the step it ran in, the manual
collection runs in the steps it names and only there, and Python's automatic collection is back on
however the loop ends."""

from __future__ import annotations

import gc

import pytest

from ghsweep.train.gc_pauses import YOUNG, GcPauses


def cycles(n: int = 2000) -> None:
    """Garbage only a collection frees: objects that refer to themselves."""
    for _ in range(n):
        node: dict = {}
        node["self"] = node


def test_pauses_are_put_in_the_step_they_ran_in_and_counted_from_the_first_measured():
    assert gc.isenabled()
    with GcPauses() as pauses:
        assert gc.isenabled()  # no interval: Python's own collections stay on
        pauses.step_done(0)
        gc.collect()  # a full collection in step 1, as an automatic one would
        pauses.step_done(1)
        gc.collect(0)  # a young one in step 2
        pauses.step_done(2)
    ours = [(p.step, p.generation) for p in pauses.pauses]
    assert (1, 2) in ours and (2, 0) in ours and all(p.ms >= 0 for p in pauses.pauses)
    assert pauses.metrics(first_measured=1)["gc_full_collections"] >= 1
    # From step 2 on, the full collection of step 1 is left out: the warm-up's, not a measured step's.
    later = pauses.metrics(first_measured=2)
    assert later["gc_full_collections"] == sum(p.generation == 2 for p in pauses.pauses if p.step >= 2)
    measured = [p.ms for p in pauses.pauses if p.step >= 2]
    assert later["gc_pause_max_ms"] == max(measured)
    assert later["gc_pause_ms_per_step"] == pytest.approx(sum(measured) / 1)  # one step (2) measured
    # Its hook is gone after the loop: later collections are not recorded.
    seen = len(pauses.pauses)
    gc.collect()
    assert len(pauses.pauses) == seen


def test_an_interval_turns_automatic_collection_off_and_collects_the_young_every_n_steps():
    with GcPauses(interval=3) as pauses:
        assert not gc.isenabled()
        start = len(pauses.pauses)
        for step in range(7):
            cycles()
            pauses.step_done(step)
    assert gc.isenabled()
    manual = pauses.pauses[start:]
    # Steps 2 and 5 (every third), the young generations only, each inside its step.
    assert [(p.step, p.generation) for p in manual] == [(2, YOUNG), (5, YOUNG)]
    assert pauses.metrics(first_measured=0)["gc_full_collections"] == 0


def test_automatic_collection_is_back_on_when_the_loop_raises():
    pauses = GcPauses(interval=2)
    with pytest.raises(RuntimeError), pauses:
        assert not gc.isenabled()
        raise RuntimeError("a step failed")
    assert gc.isenabled() and pauses._timed not in gc.callbacks
