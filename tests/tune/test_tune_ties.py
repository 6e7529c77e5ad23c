"""The tune report's ties: trials whose objective is within the noise of the best trial's."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import create_trial

from ghsweep.tune.settings import Objective, TuneSettings
from ghsweep.tune.study_report import tied_with_best


def trial(precision: str, tokens_per_s: float, half_width: float) -> optuna.trial.FrozenTrial:
    return create_trial(
        params={"precision": precision},
        distributions={"precision": CategoricalDistribution(["bf16", "fp8", "fp16"])},
        value=tokens_per_s,
        user_attrs={"tokens_per_s_ci": [tokens_per_s - half_width, tokens_per_s + half_width]},
        system_attrs={"constraints": [0.0]},
    )


def test_trials_within_the_best_ones_noise_are_tied_with_it():
    study = optuna.create_study(direction="maximize")
    for t in (trial("bf16", 17500.0, 80.0), trial("fp8", 17560.0, 90.0), trial("fp16", 16000.0, 80.0)):
        study.add_trial(t)
    settings = TuneSettings(1, 1, (Objective("tokens_per_s", "maximize"),), (), "tpe", 4, 0, "", None)
    assert study.best_trial.params == {"precision": "fp8"}
    assert [t.params["precision"] for t in tied_with_best(study, settings)] == ["bf16"]
