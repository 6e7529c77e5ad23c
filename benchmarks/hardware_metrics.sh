#!/usr/bin/env bash
# What the hardware did, on one GPU (about 5-7 minutes on one H100/H200; nsys on PATH):
#   bash benchmarks/hardware_metrics.sh OUT
# 1. sweep: precision=bf16,fp8 on Llama-2-7B's shape (random weights, LoRA, seq 4096) under nsys, with
#    the worker's NVML sampling every 0.5 s: GPU utilisation, memory, SM clock, power, temperature, energy
#    per step and tokens per joule in each summary; the comparison's kernel diff and tokens/J column.
# 2. oom: the tiny model with a step of 8.4M tokens: must end FAILED in one line (requested / allocated /
#    reserved / total GiB) with memory_snapshot.pickle.
# 3. gpu_metrics: the bf16 run again with profile.nsys.gpu_metrics=true (`--gpu-metrics-devices`): does
#    nsys sample here, and does the analysis read it? A small copy of its GPU_METRICS tables is kept.
# 4. pytest -m gpu tests/train/test_memory_record.py (gpu_tests.log).
# Writes into OUT: mlflow.db (the store: `python3 benchmarks/system_metrics_screenshot.py OUT` shows its
# System metrics view), sweep.log, comparison.md, summary_*.json, system_metrics_*.jsonl, oom.log,
# oom_result.json, memory_snapshot.pickle (when under 20 MB, else its size in oom.json),
# gpu_metrics.log, gpu_metrics_profile_analysis.json, gpu_metrics_sample.sqlite, hardware_metrics.json; prints the table of them last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash benchmarks/hardware_metrics.sh OUT}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
# ghsweep asks NVML through nvidia-ml-py: install its wheel (WHEELS=DIR) where it is missing.
python3 -c "import pynvml" 2>/dev/null || pip install --no-index --no-deps "${WHEELS:?nvidia-ml-py is missing: WHEELS=DIR holding nvidia_ml_py-*.whl}"/nvidia_ml_py-*.whl
store="sqlite:///$out/mlflow.db"
export MLFLOW_DISABLE_TELEMETRY=true

# 1. The sweep (its MLflow artifacts go under $work, the store itself into OUT).
(cd "$work" && python3 -m ghsweep -m precision=bf16,fp8 model=llama2_7b profile=nsys train.seq_length=4096 \
  train.micro_batch_size=1 train.max_steps=30 train.measure=false system_metrics.interval_s=0.5 \
  tracking.uri="$store" hydra.sweep.dir="$work/sweep") > "$out/sweep.log" 2>&1
echo "sweep exit status $?" >> "$out/sweep.log"
cp "$work/sweep/comparison/comparison.md" "$out/" 2>/dev/null
for run in "$work"/sweep/[0-9]*; do
  n=$(basename "$run")
  cp "$run/summary.json" "$out/summary_$n.json" 2>/dev/null
  cp "$run/system_metrics.jsonl" "$out/system_metrics_$n.jsonl" 2>/dev/null
done

# 2. Out of memory.
(cd "$work" && python3 -m ghsweep data.num_examples=40000 data.packing_mask=causal train.compile=false \
  train.seq_length=2048 train.micro_batch_size=4096 train.max_steps=2 train.warmup_steps=1 profile=none \
  tracking.uri="$store" hydra.run.dir="$work/oom") > "$out/oom.log" 2>&1
cp "$work/oom/result.json" "$out/oom_result.json" 2>/dev/null
snapshot="$work/oom/memory_snapshot.pickle"
snapshot_bytes=$(stat -c %s "$snapshot" 2>/dev/null || echo 0)
if [ "$snapshot_bytes" -gt 0 ] && [ "$snapshot_bytes" -le 20000000 ]; then cp "$snapshot" "$out/"; fi

# 3. nsys GPU metrics: one bf16 run as in the sweep, with profile.nsys.gpu_metrics=true.
(cd "$work" && python3 -m ghsweep precision=bf16 model=llama2_7b profile=nsys profile.nsys.gpu_metrics=true \
  train.seq_length=4096 train.micro_batch_size=1 train.max_steps=15 train.measure=false \
  tracking.uri="$store" hydra.run.dir="$work/gpu_metrics") > "$out/gpu_metrics.log" 2>&1
cp "$work/gpu_metrics/profile_analysis.json" "$out/gpu_metrics_profile_analysis.json" 2>/dev/null

# 4. The GPU tests of these features (out of memory, NVML metrics and energy, peak breakdown, profile=memory).
timeout 150 python3 -m pytest -n 0 -q -m gpu tests/train/test_memory_record.py > "$out/gpu_tests.log" 2>&1

python3 - "$out" "$work" "$snapshot_bytes" <<'PY'
import json, pickle, sqlite3, sys
from pathlib import Path
out, work, snapshot_bytes = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
result = {"runs": {}, "oom": {}, "gpu_metrics": {}}
for f in sorted(out.glob("summary_*.json")):
    s = json.loads(f.read_text())
    m, i = s["metrics"], s["info"]
    result["runs"][f.stem] = {k: m.get(k) for k in (
        "tokens_per_s", "step_time_ms", "gpu_power_w", "energy_j_per_step", "tokens_per_joule", "steady_energy_j",
        "gpu_0_utilization_percentage_mean", "gpu_0_memory_usage_megabytes_peak",
        "gpu_0_sm_clock_mhz_mean", "gpu_0_temperature_celsius_peak", "gpu_0_power_usage_watts_peak",
        "cpu_utilization_percentage_mean", "peak_mem_gb", "peak_params_gb", "peak_grads_gb",
        "peak_optimizer_state_gb", "peak_activations_gb", "peak_other_gb")} | {"energy_measured_by": i.get("energy_measured_by"),
        "system_metrics": i.get("system_metrics"), "device_name": i.get("device_name")}
oom = out / "oom_result.json"
if oom.exists():
    r = json.loads(oom.read_text())
    result["oom"] = {"status": r["status"], "error": r.get("error")}
result["oom"]["snapshot_bytes"] = snapshot_bytes
snap = out / "memory_snapshot.pickle"
if snap.exists():
    data = pickle.loads(snap.read_bytes())
    result["oom"]["snapshot_segments"] = len(data.get("segments", []))
    result["oom"]["snapshot_trace_events"] = sum(len(t) for t in data.get("device_traces", []))
analysis = out / "gpu_metrics_profile_analysis.json"
if analysis.exists():
    a = json.loads(analysis.read_text())
    result["gpu_metrics"]["analysis"] = a.get("gpu_metrics")
    result["gpu_metrics"]["finding"] = next((f["message"] for f in a.get("findings", []) if f["id"] == "gpu_metrics"), None)
db = work / "gpu_metrics" / "profile.sqlite"
if db.exists():
    con = sqlite3.connect(db)
    tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
    g = result["gpu_metrics"]
    g["tables"] = sorted(t for t in tables if "METRIC" in t)
    if "GPU_METRICS" in tables and "TARGET_INFO_GPU_METRICS" in tables:
        g["rows"] = con.execute("select count(*) from GPU_METRICS").fetchone()[0]
        g["metrics"] = {name: avg for name, avg in con.execute(
            "select i.metricName, avg(m.value) from GPU_METRICS m join TARGET_INFO_GPU_METRICS i "
            "on m.typeId = i.typeId and m.metricId = i.metricId group by i.metricName")}
        g["schema"] = {t: con.execute(f"select sql from sqlite_master where name='{t}'").fetchone()[0]
                       for t in ("GPU_METRICS", "TARGET_INFO_GPU_METRICS")}
        # A small copy with the real schema: the metric list and the first 2000 samples.
        sample = out / "gpu_metrics_sample.sqlite"
        sample.unlink(missing_ok=True)
        con.execute(f"attach database '{sample}' as sample")
        for t in ("TARGET_INFO_GPU_METRICS", "GPU_METRICS", "META_DATA_EXPORT", "META_DATA_CAPTURE", "TARGET_INFO_GPU"):
            if t in tables:
                con.execute(con.execute(f"select sql from sqlite_master where name='{t}'").fetchone()[0].replace(
                    f"CREATE TABLE {t}", f"CREATE TABLE sample.{t}", 1))
                limit = " limit 2000" if t == "GPU_METRICS" else ""
                con.execute(f"insert into sample.{t} select * from main.{t}{limit}")
        con.commit()
    else:
        g["unsupported"] = (out / "gpu_metrics.log").read_text()[-1500:]
elif not analysis.exists():
    result["gpu_metrics"]["unsupported"] = (out / "gpu_metrics.log").read_text()[-1500:]
(out / "hardware_metrics.json").write_text(json.dumps(result, indent=1))
print("files in " + str(out) + ": " + " ".join(sorted(p.name for p in out.iterdir())))

print(f"\n{'run':<12} {'tokens/s':>9} {'W mean':>7} {'J/step':>7} {'tokens/J':>9} {'util %':>7} {'mem MB peak':>12} {'SM MHz':>7} {'temp C':>7}  energy by")
for name, r in result["runs"].items():
    f = lambda k, spec: format(r[k], spec) if isinstance(r.get(k), (int, float)) else "-"
    print(f"{name:<12} {f('tokens_per_s', ',.0f'):>9} {f('gpu_power_w', '.0f'):>7} {f('energy_j_per_step', '.1f'):>7} "
          f"{f('tokens_per_joule', '.1f'):>9} {f('gpu_0_utilization_percentage_mean', '.0f'):>7} "
          f"{f('gpu_0_memory_usage_megabytes_peak', ',.0f'):>12} {f('gpu_0_sm_clock_mhz_mean', '.0f'):>7} "
          f"{f('gpu_0_temperature_celsius_peak', '.0f'):>7}  {r.get('energy_measured_by')}")
for name, r in result["runs"].items():
    print(f"{name}: peak {r.get('peak_mem_gb')} GiB = " + ", ".join(
        f"{k[5:-3]} {r[k]:.2f}" for k in r if k.startswith("peak_") and k.endswith("_gb") and k != "peak_mem_gb"
        and isinstance(r[k], (int, float))))
print(f"oom: {result['oom']}")
g = result["gpu_metrics"]
print("nsys gpu metrics: " + (f"{g['rows']} samples; " + "; ".join(f"{k} {v:.1f}" for k, v in g["metrics"].items())
                             if "rows" in g else f"not sampled here: {g.get('unsupported', 'no export')[-300:]}"))
print(f"analysis finding: {g.get('finding')}")
tests = (out / "gpu_tests.log").read_text().strip().splitlines() if (out / "gpu_tests.log").exists() else ["not run"]
print(f"gpu tests: {tests[-1] if tests else 'no output'}")
PY
