"""Capture the planted profiling scenarios on an NVIDIA GPU: the real test data of tests/profile.

    python tests/profile/capture_scenarios.py all --out DIR [--nsys PATH] [--ncu PATH]

runs each scenario (a small transformer, a few steps, NVTX "step N" ranges and the CUDA profiler
capture window of ghsweep/train/phases.py) under `nsys profile` with ghsweep's own command line,
exports SQLite, records `nsys stats` CSVs of each export (the cross-check of the analysis), times
the same steps without nsys (nsys overhead), runs one Nsight Compute roofline pass over the clean
run's top-5 kernels plus a bf16 GEMM of known FLOPs (tensor-core calibration), and writes a
PyTorch-profiler trace of the clean run. Needs torch with CUDA, nsys and ncu; not run in CI.

    python tests/profile/capture_scenarios.py gpu-runs --out DIR [--nsys PATH]

captures the runs the analysis is cross-checked on, into DIR/gpu_profiles.tar.gz (unpack it into
tests/data/profiles): `bf16/` and `fp8/`, ghsweep's own training (`python -m ghsweep`, a four-layer
Llama of the 7B's width, LoRA) under nsys with `precision=bf16` and `precision=fp8`; and
`crosscheck/`, the offload scenario under nsys and the PyTorch profiler at once (the same steps
of one run; two runs of the same program when the two profilers cannot share the GPU's counters,
said in crosscheck/capture.json). Each export comes with its `nsys stats` CSVs.

    python tests/profile/capture_scenarios.py train SCENARIO [--steps N ...]

is the profiled program itself. Scenarios: clean (compute-bound, data already on the GPU),
dataload (num_workers=0 data loader with slow per-sample CPU work), hostsync (.item() after every
layer and on the loss, with host work after each), pageable (large copies from and to pageable
host memory every step), offload (saved activations to pinned host memory and back:
torch.autograd.graph.save_on_cpu), unified (inputs staged in a small CUDA managed buffer written
by the CPU every step).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import gzip
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ghsweep.capture import nsight_commands  # noqa: E402
from ghsweep.capture.torch_capture import TorchCapture  # noqa: E402
from ghsweep.core.run_dir import NSYS_REPORT, NSYS_SQLITE  # noqa: E402
from ghsweep.profile import nsight_exports  # noqa: E402
from ghsweep.profile.analysis import analyze  # noqa: E402
from ghsweep.train.phases import Phases  # noqa: E402

SCENARIOS = ("clean", "dataload", "hostsync", "pageable", "offload", "unified")
NSYS_TRACE = ("cuda", "nvtx", "osrt", "cudnn", "cublas")
# Small exports: no CPU sampling or context switches (they make reports of gigabytes).
NSYS_EXTRA = ("--sample=none", "--cpuctxsw=none")
STATS_REPORTS = (
    "cuda_gpu_kern_sum",
    "cuda_gpu_mem_time_sum",
    "cuda_gpu_mem_size_sum",
    "cuda_api_sum",
    "nvtx_sum",
    "osrt_sum",
    "um_sum",
    "um_total_sum",
)
VOCAB, HIDDEN, HEADS, FFN, LAYERS, BATCH, SEQ = 8192, 2048, 16, 8192, 4, 8, 1024
MANAGED_MB = 64
CALIBRATION_MNK = 4096


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                HIDDEN, HEADS, FFN, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
            )
            for _ in range(LAYERS)
        )
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(ids)
        if extra is not None:
            x = x + extra.view_as(x).to(x.dtype)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(x)
        return F.cross_entropy(logits.float().view(-1, VOCAB), ids.view(-1))


def busy_host_work(seconds: float) -> None:
    """CPU-bound host work (preprocessing, logging) of a fixed length."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class SlowSamples(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> torch.Tensor:
        busy_host_work(0.0025)  # per-sample tokenisation/augmentation in the training process
        return torch.randint(0, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(i))


class ManagedBuffer:
    """A CUDA managed allocation seen as a GPU tensor and as a CPU tensor (no copies)."""

    def __init__(self, nbytes: int):
        self.cuda = ctypes.CDLL("libcuda.so.1")
        ptr = ctypes.c_uint64()
        status = self.cuda.cuMemAllocManaged(ctypes.byref(ptr), ctypes.c_size_t(nbytes), ctypes.c_uint(1))
        if status != 0:
            raise RuntimeError(f"cuMemAllocManaged failed: CUresult {status}")
        self.ptr, n = ptr.value, nbytes // 2
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f2", "data": (self.ptr, False), "version": 3}
        self.gpu = torch.as_tensor(self, device="cuda")
        array = (ctypes.c_uint16 * n).from_address(self.ptr)
        self.cpu = torch.frombuffer(array, dtype=torch.float16)


def train(
    scenario: str, steps: int, capture_start: int, capture_steps: int, timing_out: Path | None, torch_trace: Path | None
) -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = TinyLM().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gpu_batches = [torch.randint(0, VOCAB, (BATCH, SEQ), device=device) for _ in range(4)]
    loader = iter(torch.utils.data.DataLoader(SlowSamples(), batch_size=BATCH, num_workers=0))
    host_in = torch.randn(64 * 2**20)  # 256 MiB pageable: copied to the GPU every step
    managed = ManagedBuffer(MANAGED_MB * 2**20) if scenario == "unified" else None
    stats = []

    def sync_after_layer(_module, _inputs, output):
        stats.append(output.detach().float().norm().item())  # a sync inside forward
        busy_host_work(0.001)

    if scenario == "hostsync":
        for layer in model.layers:
            layer.register_forward_hook(sync_after_layer)

    window = range(capture_start, capture_start + capture_steps)
    phases = Phases(device, window)
    torch_capture = TorchCapture(torch_trace, device, window)
    events = []
    for step in range(steps):
        torch_capture.step(step)
        with phases.step(step):
            begin = torch.cuda.Event(enable_timing=True)
            begin.record()
            extra = None
            with phases.range("data"):
                if scenario == "dataload":
                    ids = next(loader).to(device, non_blocking=True)
                else:
                    ids = gpu_batches[step % len(gpu_batches)]
                if scenario == "pageable":
                    extra = host_in.to(device)[: BATCH * SEQ * HIDDEN]
                if managed is not None:
                    torch.cuda.synchronize()  # the CPU writes the buffer the GPU read last step
                    managed.cpu.fill_(step * 1e-3)
                    extra = managed.gpu[: BATCH * SEQ * HIDDEN]
            with phases.range("forward"), torch.autocast("cuda", dtype=torch.bfloat16):
                if scenario == "offload":
                    with torch.autograd.graph.save_on_cpu(pin_memory=True):
                        loss = model(ids, extra)
                else:
                    loss = model(ids, extra)
            with phases.range("backward"):
                loss.backward()
            with phases.range("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if scenario == "hostsync":
                stats.append(loss.item())
                busy_host_work(0.001)
            if scenario == "pageable":
                model.head.weight.detach().cpu()  # 64 MiB to pageable host memory
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            events.append((begin, end))
    torch_capture.close()
    phases.close()
    torch.cuda.synchronize()
    times = [b.elapsed_time(e) for b, e in events]
    if timing_out:
        timing_out.write_text(json.dumps({"scenario": scenario, "step_time_ms": times}))


def run(cmd: list[str], log: Path, timeout: float) -> int:
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            f.write(f"timed out after {timeout} s\n")
            return 124


def export_and_stats(nsys: str, report: Path, log: Path) -> None:
    db = nsight_exports.export_sqlite(nsys, report)
    prefix = report.parent / (report.stem + "_stats")
    cmd = [nsys, "stats", "--format", "csv", "--output", str(prefix)]
    for r in STATS_REPORTS:
        cmd += ["--report", r]
    run(cmd + [str(db)], log, 300)


def tensor_metrics(ncu: str, out: Path, log: Path) -> list[str]:
    """Metrics beyond `--set roofline` that exist on this GPU (tensor-pipe ops, bytes per level)."""
    listing = out / "ncu_query_metrics.txt"
    with open(listing, "w") as f:
        subprocess.run([ncu, "--query-metrics"], stdout=f, stderr=subprocess.STDOUT, timeout=120)
    names = {line.split()[0] for line in listing.read_text().splitlines() if line.strip() and "__" in line.split()[0]}
    wanted = [n for n in sorted(names) if n.startswith("sm__ops_path_tensor_src_") and "sparsity" not in n]
    wanted += [
        n
        for n in (
            "sm__inst_executed_pipe_tensor",
            "dram__bytes",
            "lts__t_bytes",
            "l1tex__t_bytes",
            "gpu__time_duration",
        )
        if n in names
    ]
    metrics = [f"{n}.sum" for n in wanted]
    metrics += [f"{n}.sum.peak_sustained" for n in ("dram__bytes", "lts__t_bytes", "l1tex__t_bytes") if n in names]
    with open(log, "a") as f:
        f.write(f"extra ncu metrics: {metrics}\n")
    return metrics


def ncu_pass(
    ncu: str, script: list[str], report: Path, names: list[str], count: int, metrics: list[str], out: Path, log: Path
) -> None:
    base = nsight_commands.ncu_command(ncu, report, names, count, "roofline", metrics)
    rc = run(base + script, log, 300)
    if rc != 0 and metrics:  # a metric this ncu does not know: the section set alone
        rc = run(nsight_commands.ncu_command(ncu, report, names, count, "roofline") + script, log, 300)
    if rc == 0:
        nsight_exports.ncu_raw_csv(ncu, report, out / (report.stem + ".csv"))


def all_scenarios(out: Path, nsys: str, ncu: str | None, deadline_s: float) -> None:
    started = time.time()
    out.mkdir(parents=True, exist_ok=True)
    log = out / "capture.log"
    me = [sys.executable, str(Path(__file__).resolve())]
    overhead = {}
    jobs = []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=3)
    for scenario in SCENARIOS:
        if time.time() - started > deadline_s:
            break
        d = out / scenario
        d.mkdir(exist_ok=True)
        args = ["train", scenario, "--steps", "10", "--capture-start", "1", "--capture-steps", "8"]
        if scenario == "clean":  # from the very first step: the warm-up step is in the trace
            args = ["train", scenario, "--steps", "10", "--capture-start", "0", "--capture-steps", "9"]
        if scenario in ("clean", "hostsync", "dataload"):
            run(me + args + ["--timing-out", str(d / "timing_unprofiled.json")], log, 300)
        report = d / NSYS_REPORT
        prefix = nsight_commands.NsysCapture(
            nsys, report, NSYS_TRACE, scenario == "unified", NSYS_EXTRA
        ).profile_command()
        rc = run(prefix + me + args + ["--timing-out", str(d / "timing_profiled.json")], log, 300)
        if rc != 0 or not report.exists():  # e.g. OS-runtime tracing refused: CUDA and NVTX alone
            prefix = nsight_commands.NsysCapture(
                nsys, report, NSYS_TRACE[:2], scenario == "unified", NSYS_EXTRA
            ).profile_command()
            run(prefix + me + args + ["--timing-out", str(d / "timing_profiled.json")], log, 300)
        if report.exists():
            jobs.append(pool.submit(export_and_stats, nsys, report, log))
    for job in jobs:
        try:
            job.result()
        except Exception as exc:  # keep what the other scenarios produced
            with open(log, "a") as f:
                f.write(f"export failed: {exc}\n")
    for scenario in ("clean", "hostsync", "dataload"):
        d = out / scenario
        if (d / "timing_unprofiled.json").exists() and (d / "timing_profiled.json").exists():
            plain = json.loads((d / "timing_unprofiled.json").read_text())["step_time_ms"][2:9]
            prof = json.loads((d / "timing_profiled.json").read_text())["step_time_ms"][2:9]
            overhead[scenario] = {
                "unprofiled_ms": statistics.median(plain),
                "profiled_ms": statistics.median(prof),
                "overhead_pct": 100 * (statistics.median(prof) / statistics.median(plain) - 1),
            }
    (out / "nsys_overhead.json").write_text(json.dumps(overhead, indent=2))

    clean_db = out / "clean" / NSYS_SQLITE
    if ncu and clean_db.exists():
        metrics = tensor_metrics(ncu, out, log)
        first = analyze(clean_db)
        top = first.top_kernels
        steady = first.window["steps"]
        names = sorted({k["short_name"] for k in top})
        per_step = sum(k["count"] for k in top) / max(1, len(steady))
        count = min(200, math.ceil(per_step))
        (out / "ncu_top5.json").write_text(json.dumps({"top": top, "launch_count": count}, indent=2))
        script = me + ["train", "clean", "--steps", "4", "--capture-start", "2", "--capture-steps", "1"]
        ncu_pass(ncu, script, out / "clean" / "top_kernels.ncu-rep", names, count, metrics, out / "clean", log)
        calib = me + ["calibrate"]
        ncu_pass(ncu, calib, out / "clean" / "calibration.ncu-rep", [], 1, metrics, out / "clean", log)

    if time.time() - started < deadline_s:
        run(
            me
            + [
                "train",
                "clean",
                "--steps",
                "6",
                "--capture-start",
                "3",
                "--capture-steps",
                "2",
                "--torch-trace",
                str(out / "clean" / "torch_trace.json"),
            ],
            log,
            300,
        )


# A Llama of Llama-2-7B's width and four decoder layers: the 7B's GEMM shapes in a small export,
# with enough decoder GEMMs beside the bf16 lm_head for fp8 to carry most of the GEMM time.
LLAMA_SLICE = (
    "model.hidden_size=4096",
    "model.intermediate_size=11008",
    "model.num_layers=4",
    "model.num_attention_heads=32",
    "model.num_key_value_heads=32",
    "model.vocab_size=32000",
    "train.seq_length=2048",
    "train.micro_batch_size=1",
    "train.max_steps=8",
    "train.log_every=8",
    "capture.start_step=4",
    "capture.num_steps=3",
)
GPU_RUN_STATS = ("cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum")
# What the tests read from each captured run directory.
KEPT = ("profile.sqlite", "torch_trace.json.gz", "capture.json", *(f"profile_stats_{r}.csv" for r in GPU_RUN_STATS))


def stats_csvs(nsys: str, sqlite: Path, log: Path) -> None:
    cmd = [nsys, "stats", "--format", "csv", "--force-export=false", "--output", str(sqlite.parent / "profile_stats")]
    for r in GPU_RUN_STATS:
        cmd += ["--report", r]
    run(cmd + [str(sqlite)], log, 300)


def ghsweep_run(precision: str, nsys: str, work: Path, log: Path) -> Path:
    """One `python -m ghsweep` run under nsys; its run directory."""
    run_dir = work / precision
    cmd = [
        sys.executable,
        "-m",
        "ghsweep",
        f"precision={precision}",
        "device=cuda",
        "profile=nsys",
        f"profile.nsys.path={nsys}",
        *LLAMA_SLICE,
        "tracking=sqlite",
        f"tracking.uri=sqlite:///{work}/mlflow.db",
        f"hydra.run.dir={run_dir}",
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=900, cwd=work, env=env)
        except subprocess.TimeoutExpired:
            f.write("timed out after 900 s\n")
    return run_dir


def has_kernels(trace: Path) -> bool:
    if not trace.exists():
        return False
    events = json.loads(trace.read_text()).get("traceEvents", [])
    return any(e.get("cat") == "kernel" for e in events)


def crosscheck_run(nsys: str, work: Path, log: Path) -> Path:
    """The offload scenario under nsys and the PyTorch profiler over the same steps of one run."""
    d = work / "crosscheck"
    d.mkdir(parents=True, exist_ok=True)
    trace = d / "torch_trace.json"
    args = [
        "train",
        "offload",
        "--steps",
        "6",
        "--capture-start",
        "2",
        "--capture-steps",
        "3",
        "--torch-trace",
        str(trace),
    ]
    me = [sys.executable, str(Path(__file__).resolve())]
    report = d / NSYS_REPORT
    run(
        nsight_commands.NsysCapture(nsys, report, NSYS_TRACE, False, NSYS_EXTRA).profile_command() + me + args, log, 600
    )
    simultaneous = has_kernels(trace)
    if not simultaneous:  # the profilers could not share the counters: the same program again
        run(me + args, log, 600)
    nsight_exports.export_sqlite(nsys, report)
    with open(trace, "rb") as src, gzip.open(d / "torch_trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    (d / "capture.json").write_text(json.dumps({"simultaneous": simultaneous, "command": args}))
    return d


def gpu_runs(out: Path, nsys: str) -> None:
    from ghsweep.profile.run_analysis import full_analysis

    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    work.mkdir(exist_ok=True)
    log = out / "capture.log"
    dirs = [ghsweep_run(p, nsys, work, log) for p in ("bf16", "fp8")]
    try:
        dirs.append(crosscheck_run(nsys, work, log))
    except Exception as exc:  # keep the precision runs
        with open(log, "a") as f:
            f.write(f"crosscheck failed: {exc}\n")
    rows = []
    with tarfile.open(out / "gpu_profiles.tar.gz", "w:gz") as tar:
        for d in dirs:
            sqlite = d / NSYS_SQLITE
            if not sqlite.exists():
                rows.append((d.name, "no export (see capture.log)", "", "", "", ""))
                continue
            stats_csvs(nsys, sqlite, log)
            for name in KEPT:
                if (d / name).exists():
                    tar.add(d / name, arcname=f"{d.name}/{name}")
            for path, context in ((sqlite, {"precision": "fp8"}), (d / "torch_trace.json.gz", {"precision": "fp8"})):
                if not path.exists():
                    continue
                try:
                    a = full_analysis(path, context)
                except ValueError as exc:
                    rows.append((f"{d.name}/{path.name}", str(exc)[:100], "", "", "", ""))
                    continue
                k = a.kernels
                share = f"{100 * k['fp8_gemm_ns'] / k['gemm_ns']:.0f}%" if k.get("gemm_ns") else "-"
                rows.append(
                    (
                        f"{d.name}/{path.name}",
                        f"{a['window']['basis']} {a['window']['steps']}",
                        f"{a.gpu_busy_pct:.1f}",
                        share,
                        a.top_kernels[0]["short_name"][:48],
                        ",".join(f.id for f in a.findings) or "none",
                    )
                )
    shutil.rmtree(work, ignore_errors=True)
    header = ("run", "window", "busy %", "fp8 GEMM share", "top kernel", "findings (read as precision=fp8)")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))


def calibrate() -> None:
    """One bf16 GEMM of known FLOPs (2*M*N*K) inside the profiler capture window."""
    n = CALIBRATION_MNK
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    (a @ b).sum().item()  # warm up cuBLAS outside the window
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    a @ b
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(json.dumps({"calibration_flops": 2 * n**3, "m": n, "n": n, "k": n}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("train")
    t.add_argument("scenario", choices=SCENARIOS)
    t.add_argument("--steps", type=int, default=10)
    t.add_argument("--capture-start", type=int, default=1)
    t.add_argument("--capture-steps", type=int, default=8)
    t.add_argument("--timing-out", type=Path)
    t.add_argument("--torch-trace", type=Path)
    a = sub.add_parser("all")
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--nsys", default=None)
    a.add_argument("--ncu", default=None)
    a.add_argument("--deadline-s", type=float, default=300)
    g = sub.add_parser("gpu-runs")
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--nsys", default=None)
    sub.add_parser("calibrate")
    args = parser.parse_args()
    if args.mode == "train":
        train(args.scenario, args.steps, args.capture_start, args.capture_steps, args.timing_out, args.torch_trace)
    elif args.mode == "calibrate":
        calibrate()
    else:
        nsys = nsight_commands.find_tool("nsys", args.nsys)
        if nsys is None:
            sys.exit("nsys not found: pass --nsys PATH")
        if args.mode == "gpu-runs":
            gpu_runs(args.out.resolve(), nsys)
        else:
            all_scenarios(args.out, nsys, nsight_commands.find_tool("ncu", args.ncu), args.deadline_s)


if __name__ == "__main__":
    main()
