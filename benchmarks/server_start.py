"""How long the pre-imported worker takes to start (ghsweep.launch.warm_worker_client.WarmWorker: from
its start until it says it is ready), plain and under the `nsys launch` a sweep of the default config
starts it with, and with smaller trace sets; then one `python -X importtime` breakdown of its imports
each way, written to OUT/importtime_{plain,nsys}.txt. Prints a table; run from the repository root:

    OUT=results python3 benchmarks/server_start.py

Without nsys (or a GPU, where profile=auto picks the PyTorch profiler) only the plain rows are run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from ghsweep.capture.profiler_plan import sweep_session_launch
from ghsweep.config.schema import ProfileSchema, typed_section
from ghsweep.launch.warm_worker_client import WarmWorker, WarmWorkerUnavailable, worker_env

IMPORTS = "import sys; from ghsweep.train.warm_worker import import_training; sys.exit(import_training())"


def with_trace(launch: list[str], trace: str) -> list[str]:
    return [f"--trace={trace}" if arg.startswith("--trace=") else arg for arg in launch]


def ready_s(launch: list[str]) -> float:
    started = time.monotonic()
    server = WarmWorker(worker_env(), launch)
    try:
        server.wait_until_ready()
        return time.monotonic() - started
    except WarmWorkerUnavailable as exc:
        raise SystemExit(f"the pre-imported worker refused: {exc}") from exc
    finally:
        server.close()


def main() -> None:
    out = Path(os.environ.get("OUT", "results"))
    out.mkdir(parents=True, exist_ok=True)
    with initialize_config_dir(config_dir=str(Path("conf").resolve()), version_base=None):
        profile = typed_section(ProfileSchema, compose("config").profile)
    launch = sweep_session_launch(profile, "device", "auto")
    variants = {"plain": []}
    if launch:
        variants |= {
            "nsys launch, " + next(a for a in launch if a.startswith("--trace=")): launch,
            "nsys launch, --trace=cuda,nvtx": with_trace(launch, "cuda,nvtx"),
            "nsys launch, --trace=cuda,nvtx,cudnn,cublas": with_trace(launch, "cuda,nvtx,cudnn,cublas"),
        }
    # The first two in turn twice: the first start of a machine also reads the libraries from disk.
    order = list(variants)[:2] * 2 + list(variants)[2:]
    rows = [(name, ready_s(variants[name])) for name in order]
    if launch:
        started = time.monotonic()
        subprocess.run([*launch, "--session-new=server-start-pass", sys.executable, "-c", "pass"], check=True)
        rows.append(("nsys launch of `python -c pass`", time.monotonic() - started))
    for name, prefix in (("plain", []), ("nsys", [*launch, "--session-new=server-start-imports"])):
        if name == "nsys" and not launch:
            continue
        with open(out / f"importtime_{name}.txt", "w") as err:
            subprocess.run([*prefix, sys.executable, "-X", "importtime", "-c", IMPORTS], stderr=err, check=True)
    print("| pre-imported worker | ready after (s) |\n|---|---|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
