"""`python -m ghsweep [overrides]` runs one combination; `python -m ghsweep -m ...` sweeps them."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import warnings

import hydra
from omegaconf import DictConfig

from ghsweep.core.run_result import RunStatus
from ghsweep.launch import interrupts
from ghsweep.launch.overrides import refusals
from ghsweep.tracking import redact

MAX_SHOWN_CHARS = 200

# hydra/launcher=submitit_local is hydra-submitit-launcher's local launcher under ghsweep's launch(), and
# shares the plugin's name on purpose, so Hydra matches it to the plugin's schema (the check wanted)
# and says so five times a sweep: a deprecation of Hydra's, nothing the user can act on.
warnings.filterwarnings("ignore", message=r"(?s).*is validated against ConfigStore schema with the same name")


def _shown(text: str) -> str:
    """One line of at most MAX_SHOWN_CHARS characters."""
    text = text.replace("\n", "\\n")
    return text if len(text) <= MAX_SHOWN_CHARS else f"{text[:MAX_SHOWN_CHARS]}... ({len(text)} characters)"


def check_overrides(argv: list[str]) -> None:
    """Hydra reports an override it cannot parse in several lines, some without the override: say which
    one, on one line (a secret's value and the parser's view of it left out, long values cut)."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for item in get_args_parser().parse_known_args(argv)[0].overrides:
        try:
            parser.parse_overrides([item])
        except OverrideParseException as exc:
            shown = redact.override(item)
            detail = "" if shown != item else f" ({_shown(exc.message.strip().splitlines()[0])})"
            raise SystemExit(
                f"ghsweep: override {_shown(shown)} cannot be parsed{detail}; quote a value with spaces, "
                "brackets, quotes, $, newlines or non-ASCII characters: 'key=\"value\"'"
            ) from None
    refused = refusals(get_args_parser().parse_known_args(argv)[0].overrides)
    if refused:
        raise SystemExit("\n".join(f"ghsweep: {line}" for line in refused))


# Flags that print something about the config and run nothing.
INFO_FLAGS = ("-c", "--cfg", "-h", "--help", "--hydra-help", "-i", "--info", "-sc", "--shell-completion")


def starting_line(argv: list[str]) -> str | None:
    """What the command is about to do, for its first line: composing, checking and opening MLflow take
    10-20 s on a loaded machine before Hydra prints anything. None for a command that runs nothing."""
    if any(a in INFO_FLAGS or a.startswith("--info=") for a in argv):
        return None
    sweep = "-m" in argv or "--multirun" in argv
    if any(a.lower() in ("dry_run=true", "dry_run=1") for a in argv):
        return f"ghsweep: dry run of the {'sweep' if sweep else 'run'}: planning each combination; nothing is recorded"
    if sweep:
        return "ghsweep: starting the sweep: checking every combination, opening MLflow, then training them in turn"
    return "ghsweep: starting the run: checking the config, opening MLflow, then training"


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from ghsweep.launch.combination import this_combination
    from ghsweep.launch.run_planner import not_runnable

    combo = this_combination()
    # A sweep checks every combination before it starts (launch.precheck); one run is checked here,
    # before the imports below, so a value is refused as fast as a key.
    refused = None if cfg.dry_run or combo.in_sweep else not_runnable(cfg, combo.run_dir, combo.name, combo.overrides)
    if refused:
        raise SystemExit(f"ghsweep: {refused}; nothing was recorded")
    # Here, not at the top: they import MLflow (seconds), which the pre-imported worker, started as
    # Hydra makes its callbacks, need not wait for, nor a config refused above.
    from ghsweep.launch.job import run_one
    from ghsweep.report.run_report import summary_line
    from ghsweep.tracking.mlflow_store import absolute_tracking_uri

    result = run_one(cfg, combo)
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.RUN or result.status == RunStatus.DRY_RUN:
        return result.__dict__
    if result.status == RunStatus.NOT_RUNNABLE:
        raise SystemExit(f"ghsweep: not runnable: {result.error}")
    if result.status != RunStatus.FINISHED:
        raise SystemExit(f"ghsweep: run failed: {result.error} (run directory {result.run_dir})")
    uri = absolute_tracking_uri(cfg.tracking.uri, hydra_cfg.runtime.cwd)
    print(summary_line(result, uri, cfg.tracking.experiment), flush=True)
    return result.__dict__


def end_without_teardown(succeeded: list[bool]) -> None:
    """Registered before MLflow's and the launchers' exit handlers, so run after them: once the command
    has succeeded, end the process without Python's teardown of what the sweep imported (MLflow,
    SQLAlchemy, matplotlib: 1.1 s at the end of each sweep on a 2-core machine), as a worker ends
    (train.worker.exit_now). Everything is written by then; the log handlers are closed here. A command
    that failed ends as Python ends it."""
    if succeeded:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    succeeded: list[bool] = []
    atexit.register(end_without_teardown, succeeded)
    # A log file on a full or read-only disk: the console still shows every line, and the run's record
    # says why it failed; Python's default would print a traceback for each line the file did not take.
    logging.raiseExceptions = False
    redact.install_log_redaction()
    check_overrides(sys.argv[1:])
    line = starting_line(sys.argv[1:])
    if line:
        print(line, flush=True)
    try:
        interrupts.interrupt_on_signals()
        main()
        succeeded.append(True)
    except KeyboardInterrupt as interrupt:  # the run in progress has recorded itself KILLED
        from ghsweep.launch.callbacks import SweepCallback, finish_sweep

        if SweepCallback.started_sweep_dir is None:
            print(f"ghsweep: {interrupts.reason(interrupt)}", file=sys.stderr)
            interrupts.exit_interrupted(interrupt)
        finish_sweep(SweepCallback.started_sweep_dir, interrupt=interrupt)
    except SystemExit as exit:  # its one line names what failed, a tracking URI's password too
        if isinstance(exit.code, str):
            raise SystemExit(redact.text(exit.code)) from None
        raise
