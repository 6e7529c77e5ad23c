"""What the study asks for and what it answers from record, on real Optuna studies (in memory):
a finite space is enumerated before a combination is repeated, and only a deterministic failure
stands for its combination."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from ghsweep.core.failures import DETERMINISTIC, INFRASTRUCTURE
from ghsweep.tune.settings import Objective, TuneSettings
from ghsweep.tune.space import SearchSpace
from ghsweep.tune.study import (
    TrialOutcome,
    ask_unmeasured,
    combinations,
    earlier_failures,
    knob_values,
    measured,
    tell,
    trials_done,
)

SPACE = SearchSpace(
    {"precision": CategoricalDistribution(["fp32", "bf16"]), "offload": CategoricalDistribution(["off", "on"])}, []
)
SETTINGS = TuneSettings(
    trials=4,
    parallel=1,
    objectives=(Objective("tokens_per_s", "maximize"),),
    constraints=(),
    sampler="random",
    startup_trials=0,
    seed=0,
    storage="",
    study=None,
)


def random_study(seed: int = 0) -> optuna.Study:
    return optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=seed))


def finished(overrides: list[str], tokens_per_s: float = 100.0) -> TrialOutcome:
    return TrialOutcome(overrides, "FINISHED", {"tokens_per_s": tokens_per_s})


def test_the_plain_sampler_repeats_a_combination_in_a_small_space():
    # The premise: with this seed, four asks over four combinations repeat one.
    study = random_study()
    asked = [knob_values(study.ask(SPACE.distributions).params) for _ in range(4)]
    assert len(set(asked)) < 4


def test_a_finite_space_is_enumerated_before_a_combination_is_repeated():
    study = random_study()
    while trials_done(study) < 4:
        trial = ask_unmeasured(study, SPACE, measured(study), seed=len(study.trials))
        tell(study, SETTINGS, trial, finished(SPACE.overrides(trial.params)))
    counted = study.get_trials(states=(TrialState.COMPLETE,))
    assert len({knob_values(t.params) for t in counted}) == 4
    repeats = study.get_trials(states=(TrialState.FAIL,))
    assert repeats and all(t.user_attrs["repeat_of"] == "measured before" for t in repeats)
    # Every combination measured: a repeat is all that is left, and it is asked.
    fifth = ask_unmeasured(study, SPACE, measured(study), seed=99)
    assert knob_values(fifth.params) in measured(study)


def test_an_integer_knob_is_enumerated_and_a_float_one_is_not():
    space = SearchSpace({"a": IntDistribution(0, 8, step=4), "b": CategoricalDistribution(["x", "y"])}, [])
    assert sorted(combinations(space)) == sorted(knob_values({"a": a, "b": b}) for a in (0, 4, 8) for b in ("x", "y"))
    assert combinations(SearchSpace({"lr": optuna.distributions.FloatDistribution(0.1, 1.0)}, [])) is None


def test_only_a_deterministic_failure_is_answered_from_record():
    study = random_study()
    oom = study.ask(SPACE.distributions)
    told = tell(
        study,
        SETTINGS,
        oom,
        TrialOutcome(SPACE.overrides(oom.params), "FAILED", error="OutOfMemoryError: CUDA out of memory"),
    )
    assert told == "failed (deterministic): OutOfMemoryError: CUDA out of memory"
    assert earlier_failures(study) == {
        knob_values(oom.params): f"as in trial {oom.number}: OutOfMemoryError: CUDA out of memory"
    }

    lost = ask_unmeasured(study, SPACE, measured(study), seed=1)
    node_fail = "SLURM job 7 ended NODE_FAIL"
    told = tell(study, SETTINGS, lost, TrialOutcome(SPACE.overrides(lost.params), "FAILED", error=node_fail))
    assert told == f"failed for its infrastructure: {node_fail}; asked again"
    assert study.trials[lost.number].state == TrialState.FAIL  # not counted, and samplers ignore it
    assert trials_done(study) == 1 and knob_values(lost.params) not in earlier_failures(study)
    # Asked again next, as it was.
    again = ask_unmeasured(study, SPACE, measured(study), seed=2)
    assert (again.params, again.user_attrs["retry_of"]) == (lost.params, lost.number)
    # Failing for its infrastructure a second time, it counts as failed, still not answered from record.
    told = tell(
        study,
        SETTINGS,
        again,
        TrialOutcome(SPACE.overrides(again.params), "FAILED", error=node_fail, failure_class=INFRASTRUCTURE),
    )
    assert told == f"failed (infrastructure): {node_fail}"
    assert trials_done(study) == 2 and knob_values(again.params) not in earlier_failures(study)
    assert study.trials[oom.number].user_attrs["failure_class"] == DETERMINISTIC
