"""Recording a run while it trains: which profiler a run gets and the worker's profiler prefix
(profiler_plan.py), the Nsight Systems and Nsight Compute command lines (nsight_commands.py), the
sweep's side of an nsys session whose collections it hands to forked workers (nsys_session.py), and
the PyTorch profiler's window in the training loop (torch_capture.py).

It imports core and config alone, so the worker and the job record a run without loading the
analysis; what reads a recording afterwards is ghsweep.profile.
"""
