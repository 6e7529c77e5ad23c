"""Profiling of a run: capture commands (nsys, ncu, PyTorch profiler) and the automatic analysis
of what they recorded (device busy/idle, gaps and their causes, top kernels, transfers, unified
memory, roofline), said in words as findings."""
