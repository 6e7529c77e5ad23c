"""The automatic analysis of what a run's profiler recorded (device busy/idle, gaps and their causes,
top kernels, transfers, unified memory, roofline), said in words as findings. What records a run
(which profiler, the nsys and ncu commands, the PyTorch profiler's window) is ghsweep.capture.

After the worker: pipeline.py (export, ncu pass, analysis, report, plots, what goes to MLflow).
The analysis: analysis.py picks the reader by file type (nsys_analysis.py, torch_trace.py); both
hand their operations and host evidence to engine.py, which fills one result.ProfileAnalysis;
run_analysis.py adds the roofline (roofline.py), findings (findings.py) and, on several GPUs, the
ranks (ranks.py); profile_report.py and profile_plots.py render it.
"""
