"""Stand-ins for programs and facts this machine lacks (a container runtime, the Nsight tools, a node's
GPU)."""

from __future__ import annotations

from pathlib import Path

from ghsweep.core.gpu import GpuInfo

# No container runtime is installed here: this stands in for `singularity exec [--nv] [--bind B]...
# [--env K=V]... IMAGE CMD...`, running CMD on this machine with the image's tools (IMAGE.bin/) first
# on PATH, so the job's lookup inside the container really runs a command through the prefix.
FAKE_RUNTIME = """#!/bin/sh
shift
while [ $# -gt 0 ]; do case "$1" in --nv) shift;; --bind|--env) shift 2;; *) break;; esac; done
image=$1; shift
PATH="$image.bin:$PATH" exec "$@"
"""


def script(directory: Path, name: str, text: str) -> Path:
    """An executable `directory/name` running `text`."""
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def fake_runtime(directory: Path) -> Path:
    return script(directory, "singularity", FAKE_RUNTIME)


def tool(directory: Path, name: str) -> Path:
    """An executable standing in for an installed nsys/ncu (nothing runs it in a dry run)."""
    return script(directory, name, "#!/bin/sh\nexit 0\n")


# A node's GPU as nvidia-smi reports it (ghsweep.core.gpu.probe_gpu): what the job plans with on a GPU node.
NODE_GPU = GpuInfo("NVIDIA H200", (9, 0), 139.8, 139.0, 1)


# Nsight Systems needs a GPU: this stands in for its session commands, as ghsweep's pre-imported worker
# uses them (ghsweep.launch.warm_worker_client.WarmWorker). `nsys launch [OPTIONS] --session-new=S PROGRAM`
# runs PROGRAM with a variable of its own added, as nsys adds CUDA_INJECTION64_PATH and the rest (here
# CUDA_VISIBLE_DEVICES=5, which a worker records); `start` and `stop` succeed unless a file
# `start.fails` beside it holds nsys's refusal, and `sessions list` shows S in the state a file `state`
# beside it holds (a test's stand-in for nsys's own progress), else back in state Launched.
# Each call is appended to `calls` beside it.
FAKE_NSYS = """#!/bin/sh
here=$(dirname "$0")
echo "$*" >> "$here/calls"
case "$1" in
  launch)
    shift
    while [ $# -gt 0 ]; do
      case "$1" in --session-new=*) echo "${1#--session-new=}" > "$here/session"; shift;; --*) shift;; *) break;; esac
    done
    CUDA_VISIBLE_DEVICES=5 exec "$@";;
  start) [ -f "$here/start.fails" ] && { cat "$here/start.fails"; exit 1; }; exit 0;;
  stop) exit 0;;
  sessions)
    state=Launched; [ -f "$here/state" ] && state=$(cat "$here/state")
    echo "ID TIME STATE LAUNCH NAME"; echo "4242 00:01 $state 1 $(cat "$here/session")";;
esac
"""


def fake_nsys(directory: Path) -> Path:
    return script(directory, "nsys", FAKE_NSYS)
