"""The pre-imported worker: `python -m ghsweep.train.warm_worker FD` imports what training needs once
(torch, transformers, peft, torchao: most of a worker's start) and warms peft's first wrap, then forks
one worker per request on the Unix socket FD. A sweep that runs its combinations one after another in
its own process starts one (ghsweep.launch.warm_worker_client.WarmWorker) and skips those imports from
its first combination on.

Each forked worker is what `python -m ghsweep.train.worker RUN_DIR` would be: a process of its own in
a session of its own (a timeout kills its process group, a crash takes down only its run), with the
environment the server started in, and the working directory and output the request brings. The
client starts a server per environment (what torch reads at import must be the run's), and a request
may add variables of the run's own that nothing reads at import (ghsweep.core.handoff's); one started
under `nsys launch` passes nsys's variables on, so nsys traces each worker. The imports run with torch's CUDA
check asking NVML rather than the driver (PYTORCH_NVML_BASED_CUDA_CHECK), so nothing here initialises
CUDA and each worker sets CUDA up for itself, as a fresh process would.

multiprocessing's forkserver preloads modules the same way, but its children keep the output the
server started with; a run's own (its log pipe) comes with each request here.

One request at a time, as JSON on a SOCK_SEQPACKET socket: the server first says {"ready": true} (or
{"error": why} and exits); the client sends {"run_dir", "cwd", "env"} with the worker's output fd
attached (SCM_RIGHTS); the server answers {"pid": N} and, once that worker has ended, {"returncode":
N} (negative: killed by that signal, as subprocess reports it). The server ends when the client closes
the socket.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import json
import os
import socket
import sys
from collections.abc import Iterator

from ghsweep.core.gpu import GpuInfo, probe_gpu

# Large enough for any message: a request holds a run directory and a working directory.
MESSAGE_BYTES = 1 << 20

# What a run of the default backend imports, at the top of its modules or while it sets up, beside
# the backend's own modules (imported in import_training): peft (LoRA) and the fp8 path through torchao.
LIBRARY_MODULES = ("peft", "torchao.float8")
# torch.compile's own modules, which the first compiled layer imports (2-3 s of a run's set-up on a
# GPU, where train.compile=auto compiles); a CPU run does not compile by default, and there they would
# only lengthen the wait of a sweep's first combination for the server.
COMPILER_MODULES = (
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "torch._inductor.codegen.triton",
    "torch._inductor.runtime.triton_heuristics",
)


def send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], fds or [])


def receive(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """The next message and the fds attached to it; (None, []) when the other side closed the socket."""
    data, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 1)
    return (json.loads(data) if data else None), fds


def become_worker(sock: socket.socket, request: dict, out_fd: int, env: dict[str, str]) -> None:
    """In the forked child: become the run's worker, in environment `env`, and never return to the
    server's loop."""
    code = 1
    try:
        sock.close()
        os.setsid()
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        os.environ.clear()
        os.environ.update(env, **request.get("env", {}))
        os.chdir(request["cwd"])
        from ghsweep.train import worker

        sys.argv = [worker.__file__, request["run_dir"]]
        code = worker.main(sys.argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # The worker's exit without the interpreter's teardown (worker.exit_now). Under an nsys
        # session too: the worker's capture range has ended, and nsys holds what it recorded (its
        # cudaProfilerStop waited for the report, or the sweep said so: core/handoff.py), so nothing
        # is left for a normal exit to flush.
        os._exit(code)


@contextlib.contextmanager
def gpu_questions_answered_by_nvml(gpu: GpuInfo | None) -> Iterator[None]:
    """Within: what libraries ask of the GPU as they are imported is answered from NVML.

    torchao, which transformers and peft import, asks as it is imported whether Triton can run here
    (`torch.utils._triton.has_triton`) and for the GPU's compute capability
    (`torch.cuda.get_device_capability`). torch answers both by reading the GPU's properties through
    CUDA, which initialises it. NVML gives the same answers for the first visible GPU (the current
    device of a fresh process) without a CUDA context: its compute capability, and Triton's test on it
    (7.0 or newer). has_triton keeps its answer for the process, as torch's own caches it;
    get_device_capability is torch's own again after the imports. Without a GPU nothing changes
    (torch's checks touch no CUDA there).
    """
    import torch
    import torch.utils._triton as triton_support

    if gpu is None:
        yield
        return
    if gpu.compute_capability >= (7, 0) and triton_support.has_triton_package():
        triton_support.has_triton = functools.cache(lambda: True)
    torch_capability = torch.cuda.get_device_capability

    def capability(device: torch.types.Device = None) -> tuple[int, int]:
        index = device if isinstance(device, int) or device is None else torch.device(device).index
        return gpu.compute_capability if index in (None, 0) else torch_capability(device)

    torch.cuda.get_device_capability = capability
    try:
        yield
    finally:
        torch.cuda.get_device_capability = torch_capability


def import_training() -> str | None:
    """Import what a worker of the default backend imports, and build what peft builds at its first wrap
    (model.warm_peft); why a forked worker could not use them, or None."""
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # before torch's import
    try:
        from ghsweep.train import worker

        worker.quiet_library_noise()
        import torch

        gpu = probe_gpu()
        with gpu_questions_answered_by_nvml(gpu):
            from ghsweep.train import fp8, model, torch_train  # noqa: F401 (imported for the workers forked from here)

            for module in LIBRARY_MODULES + (COMPILER_MODULES if gpu else ()):
                importlib.import_module(module)
            model.warm_peft()
    except Exception as exc:
        return f"importing the training modules failed: {type(exc).__name__}: {exc}"
    if torch.cuda.is_initialized():
        return "importing the training modules initialised CUDA, which a forked process cannot use"
    return None


def serve(sock: socket.socket) -> int:
    # The workers' environment: the one this server started in (the sweep's, and what a profiler it
    # runs under adds, as nsys's CUDA_INJECTION64_PATH), not what the imports below set.
    env = dict(os.environ)
    error = import_training()
    if error:
        send(sock, {"error": error})
        return 1
    # What the imports made stays out of the workers' collections: a collection writes to every
    # object it visits, and each page written is copied into the worker (gc.freeze's purpose).
    gc.freeze()
    send(sock, {"ready": True})
    while True:
        request, fds = receive(sock)
        if request is None:
            return 0
        (out_fd,) = fds
        pid = os.fork()
        if pid == 0:
            become_worker(sock, request, out_fd, env)
        os.close(out_fd)
        send(sock, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        send(sock, {"returncode": os.waitstatus_to_exitcode(status)})


def main(fd: int) -> int:
    try:
        return serve(socket.socket(fileno=fd))
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the sweep ended while a worker ran: nobody is left to answer


if __name__ == "__main__":
    # Without the interpreter's teardown of torch and transformers (seconds), as the worker ends.
    os._exit(main(int(sys.argv[1])))
