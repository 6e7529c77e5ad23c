"""The hand-off of a run's Nsight Systems collection between the sweep and the worker it forked.

Under an nsys session (the pre-imported worker's, ghsweep.launch.warm_worker_client) nsys writes a run's
report in its own process once the worker's capture stops: 6-9 s on an H200 for the seed's trace set.
A worker that waits inside cudaProfilerStop for it, and a sweep that arms the next collection only
once it is written, spend that time on nothing. Handed over, the sweep forks the next worker at once
and arms its collection (`nsys start`) while the report is written; the worker stops its capture
without waiting and exits as soon as nsys has the report in hand.

They speak through files in the run directory, each made whole at once (core/atomic.py):
  CAPTURE_ARMED     sweep -> worker: the collection is armed (empty), or why it is not (the worker
                    then trains without a capture window);
  CAPTURE_STOPPING  worker -> sweep: the capture has begun to stop;
  CAPTURE_MAY_EXIT  sweep -> worker: nsys writes the report in its own process (the session left
                    RangeCollection): a worker that exits earlier leaves a broken report.
The worker knows its collection is handed by HANDOFF_ENV in its environment, which the sweep sets
only for a worker it forked into a session and watches (ghsweep.capture.nsys_session).
"""

from __future__ import annotations

HANDOFF_ENV = "GHSWEEP_CAPTURE_HANDOFF"
