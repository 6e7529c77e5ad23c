"""The program benchmarks/nsys_late_arm.sh runs under `nsys launch`: a server with a worker's imports
(ghsweep.train.warm_worker.import_training, CUDA untouched) that forks one CUDA child per request.

Each child warms up, says it is ready, waits until the script has armed a collection of the session
(`nsys start`, run after the fork), records 3 NVTX-ranged steps between cudaProfilerStart/Stop, and
then ends the capture one of two ways, given per child as MODES:
  join       cudaProfilerStop in the loop (what a ghsweep worker does today), timed;
  exitS      the driver's cuProfilerStop on a helper thread, and the child exits S seconds later
             (exit = exit0) while nsys may still be writing the report;
  early:MODE MODE, the child forked as soon as the child before it exited (not when the script asks),
             so that it starts CUDA while nsys writes the report before its own;
  sub:MODE   MODE, the child with a process of its own (a python that sleeps) left behind when it
             exits, as a worker leaves torch.compile's worker pool or data loader processes;
  thread:MODE MODE, the child with a thread in timed waits (1 s each) when it exits, as a worker's
             system-metrics sampler and data loader threads are;
  -          not this server's child (with TWO_SESSIONS the script runs two servers, one a session).
The questions: does a collection armed after its child was forked record that child, and does a
report come out whole when its process exits before cudaProfilerStop has returned?

    python nsys_late_arm.py DIR MODES     (DIR: the files the script and this program signal by)
"""

import ctypes
import os
import subprocess
import sys
import threading
import time

from ghsweep.train.warm_worker import import_training

error = import_training()
if error:
    sys.exit(error)
import torch  # noqa: E402  (after import_training, which sets how torch checks for CUDA)

signals, modes = sys.argv[1], sys.argv[2].split(",")


def wait_for(name: str) -> None:
    while not os.path.exists(f"{signals}/{name}"):
        time.sleep(0.01)


def wait_forever() -> None:
    never = threading.Event()
    while not never.wait(1.0):
        pass


def child(n: int, mode: str) -> None:
    mode = mode.removeprefix("early:")
    if mode.startswith("thread:"):
        threading.Thread(target=wait_forever, daemon=True).start()
        mode = mode.removeprefix("thread:")
    if mode.startswith("sub:"):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        mode = mode.removeprefix("sub:")
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):
        x @ x
    torch.cuda.synchronize()
    open(f"{signals}/ready_{n}", "w").close()
    wait_for(f"armed_{n}")
    torch.cuda.cudart().cudaProfilerStart()
    for i in range(3):
        torch.cuda.nvtx.range_push(f"step_{n}_{i}")
        for _ in range(10 * n):  # 30 n kernels in child n's report
            x @ x
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    began = time.time()
    with open(f"{signals}/began_{n}", "w") as f:
        f.write(str(began))
    if mode == "join":
        torch.cuda.cudart().cudaProfilerStop()
        print(f"child {n} (join): cudaProfilerStop took {time.time() - began:.2f} s", flush=True)
    else:

        def stop() -> None:
            torch.cuda.set_device(0)  # the thread's current context: the one the steps ran in
            ctypes.CDLL("libcuda.so.1").cuProfilerStop()  # ctypes lets the GIL go

        threading.Thread(target=stop, daemon=True).start()
        time.sleep(float(mode[4:] or 0))
        print(f"child {n} ({mode}): exits {time.time() - began:.2f} s after its stop began", flush=True)
    with open(f"{signals}/exited_{n}", "w") as f:
        f.write(str(time.time()))
    os._exit(0)


for n, mode in enumerate(modes, 1):
    if mode == "-":
        continue
    wait_for(f"exited_{n - 1}" if mode.startswith("early:") else f"go_{n}")
    pid = os.fork()
    if pid == 0:
        child(n, mode)
    os.waitpid(pid, 0)
    open(f"{signals}/done_{n}", "w").close()
