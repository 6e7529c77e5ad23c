"""The run's log file (`ghsweep.log` in its run directory), as Hydra's job logging writes it.

Python's FileHandler opens its file again when a line comes after it was closed (as Hydra does when
it sets up the next job's logging), and an error there (the directory full, read-only or gone) is
raised into the code that logged the line: a sweep's follow-up that was recording a run would stop
with a traceback. Here such a line goes to the handler's error path instead (silent under
`logging.raiseExceptions = False`, which `python -m ghsweep` sets): the console still shows it, and
the run's record says why its directory failed.
"""

from __future__ import annotations

import logging


class RunLogFile(logging.FileHandler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            super().emit(record)
        except OSError:
            self.handleError(record)
