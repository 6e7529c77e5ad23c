"""Roofline points of the top kernels from Nsight Compute's raw CSV (`ncu --import R --csv --page
raw`): achieved FLOP/s, bytes at DRAM / L2 / L1, arithmetic intensity, the share of each ceiling,
and whether each kernel is memory-, compute- or latency-bound.

FLOPs on Hopper: tensor-core work comes from the `sm__ops_path_tensor_src_*` counters, which count
floating-point operations directly. Calibrated on an H200 with a bf16 4096^3 GEMM (2*M*N*K =
137,438,953,472 FLOP): sm__ops_path_tensor_src_bf16_dst_fp32.sum read 137,438,953,472 (one FLOP per
op), while sm__inst_executed_pipe_tensor.sum read 2,097,152, i.e. 65,536 FLOP per tensor
instruction; the "512 FLOP per tensor instruction" factor of V100 would be 128x too low.
(tests/data/profiles/clean/calibration_ncu.csv; tests/profile check it.)
CUDA-core FLOPs: add + mul + 2 * fma thread instructions of fp64/fp32/fp16.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from ghsweep.core.errors import ProfileError
from ghsweep.profile.kernel_kinds import function_name

TENSOR_FLOPS_PER_OP = 1.0
# Far below the roof that applies to it: neither bandwidth nor compute limits the kernel, but
# latency (too few warps, too little work per launch, dependencies).
LATENCY_EFFICIENCY = 0.5
TENSOR_OPS = re.compile(r"^sm__ops_path_tensor_src_([a-z0-9]+?)(?:_dst_[a-z0-9]+)?\.sum$")
CUDA_CORE_OPS = {
    f"smsp__sass_thread_inst_executed_op_{p}{op}_pred_on.sum.per_cycle_elapsed": (2 if op == "fma" else 1)
    for p in "dfh"
    for op in ("add", "mul", "fma")
}
LEVELS = {"dram": "dram__bytes.sum", "l2": "lts__t_bytes.sum", "l1": "l1tex__t_bytes.sum"}
CLOCKS = {
    "dram": "dram__cycles_elapsed.avg.per_second",
    "l2": "lts__cycles_elapsed.avg.per_second",
    "l1": "l1tex__cycles_elapsed.avg.per_second",
}
SCALE = {
    "": 1,
    "byte": 1,
    "Kbyte": 1e3,
    "Mbyte": 1e6,
    "Gbyte": 1e9,
    "Tbyte": 1e12,
    "nsecond": 1e-9,
    "ns": 1e-9,
    "usecond": 1e-6,
    "us": 1e-6,
    "msecond": 1e-3,
    "ms": 1e-3,
    "second": 1,
    "s": 1,
    "hz": 1,
    "Khz": 1e3,
    "Mhz": 1e6,
    "Ghz": 1e9,
    "cycle/second": 1,
    "Kcycle/second": 1e3,
    "Mcycle/second": 1e6,
    "Gcycle/second": 1e9,
    "byte/cycle": 1,
    "Kbyte/cycle": 1e3,
    "Mbyte/cycle": 1e6,
    "inst": 1,
    "inst/cycle": 1,
    "Kinst": 1e3,
    "Minst": 1e6,
    "Ginst": 1e9,
}


def read_rows(path: Path) -> list[dict[str, float | str]]:
    """Rows of an ncu raw CSV with every numeric value in base units (bytes, seconds, Hz)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (csv.Error, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: not an Nsight Compute CSV ({exc})") from None
    if len(rows) < 3:
        return []
    header, units = rows[0], rows[1]
    out = []
    for raw in rows[2:]:
        row: dict[str, float | str] = {}
        for key, unit, value in zip(header, units, raw):
            text = value.replace(",", "")
            try:
                row[key] = float(text) * SCALE.get(unit, 1)
            except ValueError:
                row[key] = value
        out.append(row)
    return out


def _num(row: dict, key: str) -> float:
    value = row.get(key, 0.0)
    return value if isinstance(value, float) else 0.0


def tensor_ops(row: dict) -> dict[str, float]:
    return {m.group(1): _num(row, k) for k in row if (m := TENSOR_OPS.match(k)) and _num(row, k) > 0}


def dense_tensor_peak(row: dict, dtype: str) -> float:
    """Dense (sparsity off) tensor ops per cycle of `dtype`; the plain counter's peak counts 2:4 sparsity."""
    dense = [
        _num(row, k)
        for k in row
        if k.startswith("sm__ops_path_tensor_op_")
        and f"src_{dtype}" in k
        and k.endswith("sparsity_off.sum.peak_sustained")
    ]
    if dense and max(dense) > 0:
        return max(dense)
    return _num(row, f"sm__ops_path_tensor_src_{dtype}.sum.peak_sustained") / 2


def calibrate(path: Path, known_flops: float) -> dict[str, float]:
    """FLOPs per tensor-op count and per tensor instruction, from a GEMM of known FLOPs."""
    row = read_rows(path)[0]
    ops = sum(tensor_ops(row).values())
    inst = _num(row, "sm__inst_executed_pipe_tensor.sum")
    return {
        "flops_per_op": known_flops / ops if ops else 0.0,
        "flops_per_instruction": known_flops / inst if inst else 0.0,
    }


def kernel_points(path: Path, top_names: list[str] | None = None) -> dict:
    """One roofline point per kernel name (instances summed); `missing`: top names ncu did not profile."""
    rows = read_rows(path)
    grouped: dict[str, list[dict]] = {}
    for row in rows:
        grouped.setdefault(str(row.get("Kernel Name", "?")), []).append(row)
    points = [point(name, group) for name, group in grouped.items()]
    points.sort(key=lambda p: -p["time_s"])
    missing = [n for n in (top_names or []) if not any(same_function(n, g) for g in grouped)]
    return {
        "kernels": points,
        "missing": missing,
        "tensor_flops_per_op": TENSOR_FLOPS_PER_OP,
        "peaks": peaks(rows[0]) if rows else {},
    }


def same_function(short_name: str, full_name: str) -> bool:
    """Whether ncu's (demangled) kernel name is the function nsys calls `short_name`. A full name
    given as `short_name` (a PyTorch trace's) is reduced to its function name first: the two tools
    spell namespaces differently (`(anonymous namespace)` vs ncu's `<unnamed>`)."""
    short_name = function_name(short_name)
    return full_name == short_name or function_name(full_name) == short_name


def peaks(row: dict) -> dict[str, float]:
    sm_hz = _num(row, "sm__cycles_elapsed.avg.per_second")
    out = {
        f"{level}_bytes_per_s": _num(row, f"{key}.peak_sustained") * _num(row, CLOCKS[level])
        for level, key in LEVELS.items()
    }
    out["fp32_flops_per_s"] = 2 * _num(row, "sm__sass_thread_inst_executed_op_ffma_pred_on.sum.peak_sustained") * sm_hz
    out["sm_hz"] = sm_hz
    return out


def point(name: str, group: list[dict]) -> dict:
    first = group[0]
    time_s = sum(_num(r, "gpu__time_duration.sum") for r in group)
    sm_hz = _num(first, "smsp__cycles_elapsed.avg.per_second") or _num(first, "sm__cycles_elapsed.avg.per_second")
    tensor: dict[str, float] = {}
    cuda_core = 0.0
    for r in group:
        for dtype, ops in tensor_ops(r).items():
            tensor[dtype] = tensor.get(dtype, 0.0) + ops * TENSOR_FLOPS_PER_OP
        cycles = _num(r, "gpu__time_duration.sum") * sm_hz
        cuda_core += sum(_num(r, k) * factor * cycles for k, factor in CUDA_CORE_OPS.items())
    flops = sum(tensor.values()) + cuda_core
    bytes_ = {level: sum(_num(r, key) for r in group) for level, key in LEVELS.items()}
    top = peaks(first)
    if tensor:
        dtype = max(tensor, key=tensor.__getitem__)
        compute_peak = dense_tensor_peak(first, dtype) * _num(first, "sm__cycles_elapsed.avg.per_second")
    else:
        dtype, compute_peak = "fp32 (CUDA cores)", top["fp32_flops_per_s"]
    achieved = flops / time_s if time_s else 0.0
    intensity = flops / bytes_["dram"] if bytes_["dram"] else 0.0
    dram_peak = top["dram_bytes_per_s"]
    roof = min(compute_peak, intensity * dram_peak) if dram_peak else compute_peak
    pct_level = {
        level: 100 * bytes_[level] / time_s / top[f"{level}_bytes_per_s"]
        if time_s and top[f"{level}_bytes_per_s"]
        else 0.0
        for level in LEVELS
    }
    if roof and achieved / roof < LATENCY_EFFICIENCY and max(pct_level.values()) < 100 * LATENCY_EFFICIENCY:
        bound = "latency_bound"
    elif compute_peak and dram_peak and intensity >= compute_peak / dram_peak:
        bound = "compute_bound"
    else:
        bound = "memory_bound"
    return {
        "name": name,
        "instances": len(group),
        "time_s": time_s,
        "flops": flops,
        "tensor_flops": sum(tensor.values()),
        "dtype": dtype,
        "achieved_tflops": achieved / 1e12,
        "bytes_dram": bytes_["dram"],
        "bytes_l2": bytes_["l2"],
        "bytes_l1": bytes_["l1"],
        "intensity_dram": intensity,
        "intensity_l2": flops / bytes_["l2"] if bytes_["l2"] else 0.0,
        "pct_of_compute_peak": 100 * achieved / compute_peak if compute_peak else 0.0,
        "pct_of_dram_peak": pct_level["dram"],
        "pct_of_l2_peak": pct_level["l2"],
        "pct_of_l1_peak": pct_level["l1"],
        "compute_peak_tflops": compute_peak / 1e12,
        "bound": bound,
    }
