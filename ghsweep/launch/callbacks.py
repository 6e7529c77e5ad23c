"""Hydra callbacks around a multirun: the MLflow parent run before any job, the summary after all."""

from __future__ import annotations

import dataclasses
import logging
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ghsweep.config.validate import validate_launch
from ghsweep.core.atomic import write_atomic
from ghsweep.core.errors import (
    ConfigError,
    SweepDirError,
    SweepDirInUse,
    TrackingError,
    TrackingUriError,
    one_line,
)
from ghsweep.core.run_dir import (
    COMPARISON_DIR,
    RECIPE_TXT,
    RESULT,
    SWEEP_MANIFEST,
    SWEEP_SUMMARY,
    TUNE_ANSWER,
    TUNE_DIR,
    TUNE_REPORT,
)
from ghsweep.core.run_result import RunResult, RunStatus
from ghsweep.launch import interrupts
from ghsweep.launch.local_gpus import several_gpus_hint
from ghsweep.launch.precheck import sweep_refusals
from ghsweep.launch.provenance import hand_code_version_to_jobs
from ghsweep.launch.sweep_manifest import SweepEnd, SweepManifest, live_holder
from ghsweep.report.sweep_table import TERMINAL_COLUMNS, format_table
from ghsweep.tracking import redact

if TYPE_CHECKING:
    from ghsweep.tracking.mlflow_store import MlflowStore, StoredRun

# MLflow, the comparison report and the stale-run checks are imported where the sweep's record starts or
# ends, not at the top: Hydra imports this module before any check, and a mistake in a value is
# refused as fast as one in a key only when the check comes before these imports (seconds).

log = logging.getLogger(__name__)

# Only ghsweep's SLURM launcher returns at once and records its jobs for `python -m ghsweep.status`.
GHSWEEP_SLURM_LAUNCHER = "hydra_plugins.ghsweep_launcher.ghsweep_launcher.SlurmLauncher"
TUNE_SWEEPER = "hydra_plugins.ghsweep_sweeper.ghsweep_sweeper.TuneSweeper"
SWEEP_DIR_OVERRIDE = "hydra.sweep.dir="


def _job_order(result: RunResult) -> tuple[int, str]:
    return len(Path(result.run_dir).name), Path(result.run_dir).name


def collect_results(sweep_dir: Path) -> list[RunResult]:
    """Every job's result.json under the sweep directory, in job order; one cut short (a kill as it was
    written) is left out, and its run comes from MLflow (completed_from_mlflow)."""
    results = []
    for path in sweep_dir.glob(f"*/{RESULT}"):
        try:
            results.append(RunResult.load(path.parent))
        except (ValueError, TypeError) as exc:
            log.warning("%s: unreadable (%s); this run's record is taken from MLflow", path, one_line(exc))
    return sorted(results, key=_job_order)


def completed_from_mlflow(results: list[RunResult], store: MlflowStore, parent_run_id: str) -> list[RunResult]:
    """The run directories' results, completed from MLflow where a run's files fell short (a full
    disk): a child run with no result.json, or whose result.json still says RUNNING."""
    from ghsweep.launch.resume import result_from_run

    ended = {c.run_id: c for c in store.search(parent_run_id=parent_run_id) if c.status != RunStatus.RUNNING}
    completed = [
        result_from_run(ended[r.mlflow_run_id]) if r.status == RunStatus.RUNNING and r.mlflow_run_id in ended else r
        for r in results
    ]
    known = {r.mlflow_run_id for r in results}
    # A combination's run that an interrupted attempt of this sweep left KILLED is in its run directory's
    # result only if this attempt did not run it again.
    run_dirs = {r.run_dir for r in results}
    completed += [
        result_from_run(c) for run_id, c in ended.items() if run_id not in known and c.run_dir not in run_dirs
    ]
    return sorted(completed, key=_job_order)


def finish_sweep(sweep_dir: Path, failures_expected: bool = False, interrupt: KeyboardInterrupt | None = None) -> None:
    """The end of a sweep whose jobs all ended: summary table, comparison report, the parent run
    ended; SystemExit when a run failed, unless failures are expected (a tuning study's failed
    trials are part of its search). Run by the sweep itself, or by `python -m ghsweep.status`
    for a sweep submitted with wait=false.

    With `interrupt` (Ctrl-C or SIGTERM of the sweep process): runs still RUNNING end KILLED, the
    summary shows what finished, the parent run ends KILLED, and the exit status is 130 or 143.
    The comparison report is left out: a stopped process should stop soon.
    """
    from ghsweep.launch.stale_runs import end_running_children
    from ghsweep.tracking.mlflow_store import MlflowStore

    manifest = SweepManifest.require(sweep_dir)
    if not sweep_dir.is_dir():
        log.error("%s: the sweep directory was removed; its runs are taken from MLflow", sweep_dir)
    results = collect_results(sweep_dir)
    store: MlflowStore | None = None
    parent_id, missing, lost = manifest.parent_run_id, [], "the store could not be reached while they ran"
    try:
        store = MlflowStore(manifest.tracking_uri, manifest.experiment)
        parent_id = parent_in_store(store, manifest, sweep_dir)
        if interrupt is not None:
            end_running_children(store, parent_id, RunStatus.KILLED, interrupts.reason(interrupt))
        results = completed_from_mlflow(results, store, parent_id)
        recorded = {c.run_id: c for c in store.search(parent_run_id=parent_id)}
        record_from_files(store, [r for r in results if r.mlflow_run_id in recorded], recorded)
        # A reused row's run is an earlier sweep's child: it is in MLflow, under that sweep.
        missing = [r for r in results if r.mlflow_run_id not in recorded and not r.reused]
    except Exception as exc:  # the store went away: the run directories hold every record
        store, missing, lost = None, results, one_line(exc)
    table = format_table(results)
    failed = [r for r in results if r.status != RunStatus.FINISHED]
    combinations = max(manifest.combinations, len(results))
    not_started = f"; {combinations - len(results)} not started" if combinations > len(results) else ""
    reused = [f"#{i}" for i, r in enumerate(results) if r.reused]
    # Which rows this sweep did not run: their numbers are an earlier run's (force=true reruns them).
    reused_text = (
        f"; {len(reused)} reused from earlier runs ({', '.join(reused)}; force=true reruns them)" if reused else ""
    )
    print(
        f"\nghsweep: {len(results) - len(failed)} of {combinations} runs finished{not_started}{reused_text} "
        f"(sweep directory {sweep_dir})",
        flush=True,
    )
    try:
        write_atomic(sweep_dir / SWEEP_SUMMARY, f"# {manifest.command}\n\n```\n{table}\n```\n", mode=0o644)
    except OSError as exc:  # a removed or full sweep directory: the console and MLflow have the summary
        log.error("%s: not written (%s)", sweep_dir / SWEEP_SUMMARY, one_line(exc))
    not_in_mlflow = (
        f"ghsweep: {len(missing)} of {len(results)} runs are not in MLflow ({redact.text(lost)}); their records "
        f"are complete in their run directories: {', '.join(Path(r.run_dir).name for r in missing)}"
    )
    if missing:
        print(not_in_mlflow, file=sys.stderr, flush=True)
    compared = False
    if store is not None:
        try:
            compared = end_parent(store, parent_id, sweep_dir, results, failed, failures_expected, interrupt)
        except Exception as exc:  # as above: the summary and the run directories stand
            log.error("the sweep's MLflow run %s is incomplete: %s", parent_id, one_line(exc))
    if not compared:  # one table at the end: the comparison's, else this summary's (whole in SWEEP_SUMMARY)
        print(f"{format_table(results, TERMINAL_COLUMNS)}\n", flush=True)
    record_end(sweep_dir, results, failures_expected, interrupt)
    if interrupt is not None:
        print(
            f"ghsweep: {interrupts.reason(interrupt)}; to resume the sweep in this directory and MLflow run (runs "
            f"that finished are skipped): {resume_command(manifest.command, sweep_dir)}",
            file=sys.stderr,
            flush=True,
        )
        interrupts.exit_interrupted(interrupt)
    if failed and not failures_expected:
        # Hydra's multirun has no exit status of its own; a failed combination must fail the command.
        raise SystemExit(f"ghsweep: {len(failed)} of {len(results)} runs failed")
    if missing:
        raise SystemExit(not_in_mlflow)


def record_end(
    sweep_dir: Path, results: list[RunResult], failures_expected: bool, interrupt: KeyboardInterrupt | None
) -> None:
    """How the sweep ended, in its directory (SweepEnd), as its MLflow run ends."""
    try:
        SweepEnd.of(results, interrupt is not None, failures_expected).save(sweep_dir)
    except OSError as exc:  # a removed or full sweep directory: `python -m ghsweep.status` asks MLflow
        log.error("%s: not written (%s)", sweep_dir, one_line(exc))


def record_from_files(store: MlflowStore, results: list[RunResult], runs: dict[str, StoredRun]) -> None:
    """Runs that ended on disk while the store was away (their MLflow run still RUNNING): their end,
    metrics and files, recorded now that it answers."""
    from ghsweep.launch.stale_runs import record_ended_on_disk

    for result in results:
        if runs[str(result.mlflow_run_id)].status == RunStatus.RUNNING and result.status != RunStatus.RUNNING:
            record_ended_on_disk(store, result)


def end_parent(
    store: MlflowStore,
    parent_id: str,
    sweep_dir: Path,
    results: list[RunResult],
    failed: list[RunResult],
    failures_expected: bool,
    interrupt: KeyboardInterrupt | None,
) -> bool:
    """The sweep's MLflow run: its counts and summary, the comparison report, its end; True when the
    comparison was printed. The run is ended whatever becomes of the report (a removed or full sweep
    directory)."""
    from ghsweep.launch.stale_runs import end_sweep_run
    from ghsweep.report.compare import report_comparison
    from ghsweep.tracking import records

    compared = False
    try:
        records.record_sweep_totals(
            store, parent_id, records.SweepTotals(len(results), len(failed), sweep_dir / SWEEP_SUMMARY)
        )
        # Each run once: a tuning study that asked for a combination again reused its run.
        run_ids = list(dict.fromkeys(r.mlflow_run_id for r in results if r.mlflow_run_id))
        if interrupt is None and sweep_dir.is_dir():  # not made again where it was removed
            compared = report_comparison(store, parent_id, sweep_dir / COMPARISON_DIR, run_ids)
    except Exception as exc:
        log.error("the sweep's comparison is incomplete: %s", one_line(exc))
    if interrupt is not None:
        end_sweep_run(store, parent_id, RunStatus.KILLED, interrupts.reason(interrupt))
        return compared
    records.finish_sweep_run(
        store, parent_id, RunStatus.FAILED if failed and not failures_expected else RunStatus.FINISHED
    )
    return compared


def parent_in_store(store: MlflowStore, manifest: SweepManifest, sweep_dir: Path) -> str:
    """The sweep's MLflow run; one that the store lost (a SQLite file removed and made again) is
    started again, the runs recorded under its old id moved to it."""
    from ghsweep.launch.stale_runs import process_tags
    from ghsweep.tracking import records

    try:
        return store.get_run(manifest.parent_run_id).run_id
    except TrackingError:
        pass
    parent = records.start_sweep_run(store, records.SweepStart(sweep_dir, manifest.command, process_tags()))
    records.move_children(store, manifest.parent_run_id, parent)
    dataclasses.replace(manifest, parent_run_id=parent).save(sweep_dir)
    log.warning(
        "MLflow: the sweep's run %s was lost with the store; recorded again as %s", manifest.parent_run_id, parent
    )
    return parent


def check_launch(config: DictConfig) -> None:
    """The keys read before any job (switches, experiment, job name, interpolations): one line, before
    Hydra writes the first log file and before any MLflow record."""
    try:
        validate_launch(config, str(config.hydra.job.name))
    except ConfigError as exc:
        # SystemExit: Hydra turns a callback's exceptions into warnings and would run the sweep anyway.
        raise SystemExit(f"ghsweep: {exc}") from None


def _without_sweep_dir(command: str) -> list[str]:
    return [word for word in shlex.split(command) if not word.startswith(SWEEP_DIR_OVERRIDE)]


def resume_command(command: str, sweep_dir: Path) -> str:
    """The sweep's command with its directory named: Hydra's default one is named by the second the
    command starts, so the same command alone would start a new sweep."""
    return shlex.join([*_without_sweep_dir(command), f"{SWEEP_DIR_OVERRIDE}{sweep_dir}"])


def resumes(store: MlflowStore, sweep_dir: Path, uri: str, command: str) -> bool:
    """True when the sweep in `sweep_dir` is this same command (its directory named or not), into this
    store, and no longer running (interrupted, failed, or its process died): it resumes in place."""
    from ghsweep.launch.stale_runs import process_died

    earlier = SweepManifest.load(sweep_dir)
    if (
        earlier is None
        or earlier.tracking_uri != uri
        or _without_sweep_dir(earlier.command) != _without_sweep_dir(command)
    ):
        return False
    try:
        parent = store.get_run(earlier.parent_run_id)
    except TrackingError:
        return True  # its record is gone: nothing runs under it
    return parent.status != RunStatus.RUNNING or process_died(parent.tags)


def resumed_parent(store: MlflowStore, sweep_dir: Path) -> str | None:
    """The MLflow run of the sweep that this one resumes, RUNNING again under this process: one sweep,
    one run, however often it was stopped. None where the store lost it."""
    from ghsweep.launch.stale_runs import process_tags
    from ghsweep.tracking import records

    earlier = SweepManifest.require(sweep_dir).parent_run_id
    return earlier if records.reopen_sweep_run(store, earlier, process_tags()) else None


class SweepCallback(Callback):
    # The sweep this process started, for ending it when the process is interrupted (ghsweep.__main__).
    started_sweep_dir: Path | None = None
    # A dry run's combinations that no node can run: the command fails once every plan is printed.
    not_runnable: list[str] = []
    # The sweep directory a dry run made (Hydra writes multirun.yaml there, and each local job its
    # .hydra files and log): removed at its end, as it holds no sweep for `ghsweep.status` to read,
    # unless it keeps what the dry run is for (a NeMo recipe as it would run, recipe.txt).
    dry_run_dir: Path | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        check_launch(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        check_launch(config)
        total, refused = sweep_refusals(config)
        hint = several_gpus_hint(config, total)
        if hint:
            print(f"ghsweep: {hint}", flush=True)
        if config.dry_run:
            SweepCallback.not_runnable = refused
            SweepCallback.dry_run_dir = first_made(Path(config.hydra.sweep.dir))
            return
        if refused:
            # SystemExit: Hydra turns a callback's exceptions into warnings and would run the sweep anyway.
            print("\n".join(f"ghsweep: {line}" for line in refused), file=sys.stderr, flush=True)
            raise SystemExit(
                f"ghsweep: {len(refused)} of {total} combinations cannot run on any node; nothing was "
                "submitted or recorded"
            )
        if not config.wait and config.hydra.runtime.choices.get("hydra/sweeper") == "tune":
            # A setting, refused before the SLURM controller is asked whether it answers.
            raise SystemExit(
                "ghsweep: wait=false: a tuning study needs each batch's results before it asks for the "
                "next; accepted with hydra/sweeper=tune: wait=true"
            )
        from ghsweep.launch.slurm.submitted_jobs import slurm_unavailable

        launcher = config.hydra.runtime.choices["hydra/launcher"]
        unavailable = slurm_unavailable(launcher) if config.hydra.launcher._target_ == GHSWEEP_SLURM_LAUNCHER else None
        if unavailable:
            raise SystemExit(f"ghsweep: {unavailable}")
        if not config.wait and config.hydra.launcher._target_ != GHSWEEP_SLURM_LAUNCHER:
            raise SystemExit(
                f"wait=false: needs a SLURM launcher profile (e.g. hydra/launcher=gh200); "
                f"this sweep uses hydra/launcher={launcher}"
            )
        try:
            self._start_sweep(config, total)
            SweepCallback.started_sweep_dir = Path(config.hydra.sweep.dir)
        except (TrackingUriError, SweepDirError) as exc:
            raise SystemExit(f"ghsweep: {exc}") from None
        except Exception as exc:  # as above: the jobs must not run without their parent run and manifest
            raise SystemExit(
                f"ghsweep: the sweep's MLflow run could not be created at {config.tracking.uri}: {one_line(exc)}"
            ) from exc

    @staticmethod
    def _start_sweep(config: DictConfig, combinations: int) -> None:
        from ghsweep.launch.stale_runs import end_dead_sweeps, process_identity, process_tags
        from ghsweep.tracking import records
        from ghsweep.tracking.mlflow_store import MlflowStore, absolute_tracking_uri, check_tracking_uri

        sweep_dir = Path(config.hydra.sweep.dir)
        uri = absolute_tracking_uri(config.tracking.uri, config.hydra.runtime.cwd)
        command = shlex.join(["python", "-m", "ghsweep", *redact.overrides(sys.argv[1:])])
        check_tracking_uri(uri)  # a URI that cannot work leaves no sweep directory
        hand_code_version_to_jobs()
        earlier = SweepManifest.claim(sweep_dir, process_identity())  # before the store gets anything
        store = MlflowStore(uri, config.tracking.experiment)
        if earlier:
            if not resumes(store, sweep_dir, uri, command):
                raise SweepDirInUse(
                    f"hydra.sweep.dir={sweep_dir}: already holds a sweep ({SWEEP_MANIFEST}); start the sweep "
                    "again (the default directory is named by the second) or set hydra.sweep.dir to a new directory"
                )
            log.info("resuming the sweep in %s: runs that finished are skipped", sweep_dir)
            SweepEnd.clear(sweep_dir)
        end_dead_sweeps(store)
        parent = resumed_parent(store, sweep_dir) if earlier else None
        if parent is None:
            parent = records.start_sweep_run(store, records.SweepStart(sweep_dir, command, process_tags()))
            records.log_sweep_overrides(store, parent, config.hydra.overrides.task)
        SweepManifest(uri, config.tracking.experiment, parent, command, combinations).save(sweep_dir)
        log.info("MLflow: sweep run %s in experiment '%s' at %s", parent, config.tracking.experiment, uri)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        made = SweepCallback.dry_run_dir
        # Not one that a sweep claimed meanwhile (started into the same default directory, same second).
        if (
            config.dry_run
            and made is not None
            and live_holder(Path(config.hydra.sweep.dir)) is None
            and not any(made.rglob(RECIPE_TXT))
        ):
            shutil.rmtree(made, ignore_errors=True)
        if config.dry_run and SweepCallback.not_runnable:
            raise SystemExit(
                f"ghsweep: dry run: {len(SweepCallback.not_runnable)} combination(s) not runnable, "
                "marked above; the sweep would refuse to start"
            )
        # Without waiting, `python -m ghsweep.status` ends the sweep (finish_sweep) once its jobs end.
        if config.dry_run or not config.wait:
            return
        tuning = config.hydra.sweeper._target_ == TUNE_SWEEPER
        try:
            finish_sweep(Path(config.hydra.sweep.dir), failures_expected=tuning)
        except Exception as exc:  # Hydra turns a callback's exceptions into warnings and exits 0
            raise SystemExit(f"ghsweep: the sweep's end failed: {one_line(exc)}") from None
        if tuning:
            print_answer(Path(config.hydra.sweep.dir))


def first_made(sweep_dir: Path) -> Path | None:
    """The outermost directory that making `sweep_dir` would create (multirun/DATE of the default
    multirun/DATE/TIME on a new day); None when it exists already."""
    if sweep_dir.exists():
        return None
    made = sweep_dir
    while not made.parent.exists():
        made = made.parent
    return made


def print_answer(sweep_dir: Path) -> None:
    """A tuning study's answer as the last lines of the sweep's output (after its summary and
    comparison); SystemExit when no trial finished within the constraints: the command has no answer."""
    best = sweep_dir / TUNE_DIR / TUNE_ANSWER
    commands = best.read_text().strip() if best.exists() else ""
    if not commands:
        raise SystemExit(
            f"ghsweep tune: no trial finished within the constraints ({sweep_dir / TUNE_DIR / TUNE_REPORT})"
        )
    print(f"ghsweep tune: the answer ({best}):\n" + "\n".join(f"  {c}" for c in commands.splitlines()), flush=True)
