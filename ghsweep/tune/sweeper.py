"""The tune sweeper: ask Optuna for a batch of combinations, run them through the sweep's launcher,
tell Optuna each run's metrics, until the study has `tune.trials` trials; then report the answer.

Each trial is one job of the sweep (its own run directory and MLflow child run, tagged with the
study and trial number), so the launchers, the resume of finished runs and the sweep's summary
and comparison work as for a grid. Hydra instantiates it from hydra_plugins.ghsweep_sweeper.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import optuna
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf
from optuna.trial import Trial

from ghsweep.core.failures import DETERMINISTIC
from ghsweep.core.run_dir import SWEEP_CONFIG, TUNE_DIR, TUNE_REPORT
from ghsweep.core.run_result import RunStatus
from ghsweep.launch.sweep_manifest import SweepManifest
from ghsweep.tracking import records, redact
from ghsweep.tracking.mlflow_store import MlflowStore
from ghsweep.tune.check import search_space
from ghsweep.tune.settings import TuneSettings
from ghsweep.tune.space import SearchSpace
from ghsweep.tune.study import (
    TrialOutcome,
    ask_unmeasured,
    earlier_failures,
    knob_values,
    measured,
    open_study,
    prune_bar,
    tell,
    trials_done,
)
from ghsweep.tune.study_report import answer, command, summarize, write_report


class TuneSweeper(Sweeper):
    # Set by setup(), which Hydra calls before sweep().
    hydra_context: HydraContext
    config: DictConfig
    launcher: Launcher

    def __init__(self, params: dict[str, str] | None = None) -> None:
        # Presets give their search space here (hydra.sweeper.params), as for Hydra's basic sweeper.
        self.params = dict(params or {})

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> None:
        cfg = self.config
        sweep_dir = Path(cfg.hydra.sweep.dir)
        # Checked before anything was recorded (tune.check): here they are read.
        settings = TuneSettings.from_config(cfg.tune)
        space = search_space(self.params, list(arguments))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, sweep_dir / SWEEP_CONFIG)
        if cfg.dry_run:
            # What the first batch would run; the study's storage is not touched.
            study = open_study(settings, space, cfg.hydra.runtime.cwd, in_memory=True)
            batch = [space.overrides(study.ask(space.distributions).params) for _ in range(settings.parallel)]
            self.launcher.launch(batch, initial_job_idx=0)
            return

        study = open_study(settings, space, cfg.hydra.runtime.cwd)
        manifest = SweepManifest.require(sweep_dir)
        store = MlflowStore(manifest.tracking_uri, manifest.experiment)
        tune_settings = cast(dict[str, Any], OmegaConf.to_container(cfg.tune))
        records.record_study_start(
            store, manifest.parent_run_id, records.StudyStart(study.study_name, settings.storage, tune_settings)
        )
        print(
            f"ghsweep tune: study {study.study_name} ({redact.text(settings.storage)}): {trials_done(study)} of "
            f"{settings.trials} trials done before this sweep",
            flush=True,
        )

        self.job_num = 0
        while (left := settings.trials - trials_done(study)) > 0:
            taken = measured(study)
            trials = []
            for _ in range(min(settings.parallel, left)):
                trials.append(ask_unmeasured(study, space, taken, settings.seed + len(study.trials)))
                taken.add(knob_values(trials[-1].params))
            bar = prune_bar(study) if settings.prune else None
            outcomes = self._outcomes(study, space, trials, bar)
            for trial in trials:
                outcome = outcomes[trial.number]
                told = tell(study, settings, trial, outcome, bar)
                if outcome.run_id:
                    records.record_trial(store, outcome.run_id, study.study_name, trial.number)
                print(
                    redact.text(f"ghsweep tune: trial {trial.number} ({' '.join(outcome.overrides)}): {told}"),
                    flush=True,
                )

        files = write_report(study, settings, space, sweep_dir / TUNE_DIR)
        best = answer(study)
        found = records.StudyAnswer(files, [t.number for t in best], command(best[0]) if best else "")
        records.record_study_answer(store, manifest.parent_run_id, found)
        print(
            "\n" + redact.text(summarize(study, settings, space)) + f"\n  report: {sweep_dir / TUNE_DIR / TUNE_REPORT} "
            "(and on the sweep's MLflow run under tune/)\n",
            flush=True,
        )

    def _outcomes(
        self, study: optuna.Study, space: SearchSpace, trials: list[Trial], bar: float | None
    ) -> dict[int, TrialOutcome]:
        """Each trial's outcome by its number: the failure its knob values had before in the study, or
        its run, the runs of a batch launched together as jobs numbered on from the sweep's last. With
        a `bar` (tune.prune) each run stops early once its tokens/s is below it beyond the noise."""
        failed_before = {} if self.config.force else earlier_failures(study)
        # A trial's record (the study's storage, its reports) holds its overrides with secrets redacted;
        # the launcher gets the real values.
        outcomes = {
            t.number: TrialOutcome(
                redact.overrides(space.overrides(t.params)),
                RunStatus.FAILED,
                error=failed_before[key],
                failure_class=DETERMINISTIC,
            )
            for t in trials
            if (key := knob_values(t.params)) in failed_before
        }
        to_run = [t for t in trials if t.number not in outcomes]
        batch = [space.overrides(t.params) for t in to_run]
        if batch:
            self.validate_batch_is_legal(batch)
            # Under `tune`, which is not part of a run's identity: a resumed study reuses the run.
            pruning = [] if bar is None else [f"tune.prune_below_tokens_per_s={bar:.6g}"]
            jobs = self.launcher.launch([o + pruning for o in batch], initial_job_idx=self.job_num)
            self.job_num += len(batch)
            outcomes.update(
                (t.number, TrialOutcome.from_job(job, redact.overrides(o))) for t, o, job in zip(to_run, batch, jobs)
            )
        return outcomes
