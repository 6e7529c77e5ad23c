"""The sweep's side of a handed nsys collection (ghsweep.capture.nsys_session.CollectionHandoff),
against a stand-in nsys whose session state the test sets as nsys's own progress would: armed only
once the report before it is written, the worker let go only once nsys holds what it recorded, the
report counted written only once the session is idle again. The worker's side is the worker's own
code (tests/launch/test_warm_worker.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ghsweep.capture.nsys_session import CollectionHandoff, session_state
from ghsweep.core.atomic import wait_for_file, write_atomic
from ghsweep.core.run_dir import CAPTURE_ARMED, CAPTURE_MAY_EXIT, CAPTURE_STOPPING
from tests.support.stand_ins import fake_nsys

# ghsweep's handoff runs the stand-in nsys, a process (tests/support/tiers.py cannot see it).
pytestmark = pytest.mark.cli

SESSION = "ghsweep-1-test"
START = ["start", "--output=profile"]


class StandIn:
    """The stand-in nsys of one session: its calls, and the state the test gives it."""

    def __init__(self, tools: Path) -> None:
        self.tools = tools
        self.path = str(fake_nsys(tools))
        (tools / "session").write_text(SESSION)

    def state(self, state: str) -> None:
        # Whole at once: a stand-in nsys that reads a half-written state lists no session, which counts as idle.
        write_atomic(self.tools / "state", state)

    def calls(self) -> list[str]:
        calls = self.tools / "calls"
        return [c for c in calls.read_text().splitlines() if not c.startswith("sessions")] if calls.exists() else []


@pytest.fixture
def nsys(tmp_path: Path) -> StandIn:
    return StandIn(tmp_path / "tools")


def handoff(
    nsys: StandIn, run_dir: Path, after: CollectionHandoff | None = None, armed: bool = True
) -> CollectionHandoff:
    run_dir.mkdir(exist_ok=True)
    watch = CollectionHandoff(nsys.path, SESSION, [nsys.path, *START], run_dir, after, armed)
    watch.start()
    return watch


def never(event: threading.Event, seconds: float = 1.0) -> bool:
    return not event.wait(seconds)


def test_a_session_state_is_read_by_its_name(nsys):
    nsys.state("RangeCollection")
    assert session_state(nsys.path, SESSION) == "RangeCollection"
    assert session_state(nsys.path, "another") is None


def test_the_worker_may_exit_once_nsys_holds_the_report_which_is_written_once_the_session_is_idle(nsys, tmp_path):
    nsys.state("RangeCollection")
    run_dir = tmp_path / "run"
    watch = handoff(nsys, run_dir)
    (run_dir / CAPTURE_STOPPING).touch()  # the worker's stop has begun; nsys still collects
    assert never(watch.handed) and not (run_dir / CAPTURE_MAY_EXIT).exists()
    nsys.state("RangeGeneration")
    # Handed first, then the file the worker exits on: the sweep never sees an exit it did not allow.
    assert watch.handed.wait(30) and wait_for_file(run_dir / CAPTURE_MAY_EXIT, 10) == ""
    nsys.state("RangeImportation")
    assert never(watch.written)
    nsys.state("Launched")
    assert watch.written.wait(30)
    watch.join(30)
    assert nsys.calls() == []  # armed before the fork, ended by the worker's own stop: no command of its own


def test_a_collection_is_armed_only_once_the_report_before_it_is_written(nsys, tmp_path):
    nsys.state("RangeImportation")  # the earlier run's report is being written
    earlier = handoff(nsys, tmp_path / "earlier")
    (tmp_path / "earlier" / CAPTURE_STOPPING).touch()
    assert earlier.handed.wait(30)
    later = handoff(nsys, tmp_path / "later", after=earlier, armed=False)
    assert never(earlier.written) and not (tmp_path / "later" / CAPTURE_ARMED).exists()
    assert nsys.calls() == []
    nsys.state("Launched")
    assert earlier.written.wait(30)
    assert wait_for_file(tmp_path / "later" / CAPTURE_ARMED, 30) == ""  # armed: nothing to say
    assert nsys.calls() == [f"start --output=profile --session={SESSION}"]
    later.worker_ended.set()
    later.join(30)
    assert not later.is_alive() and not later.handed.is_set()


def test_a_collection_nsys_refuses_tells_the_worker_why(nsys, tmp_path):
    (nsys.tools / "start.fails").write_text("Collection start is not allowed in this state.\n")
    watch = handoff(nsys, tmp_path / "run", armed=False)
    watch.join(30)
    said = (tmp_path / "run" / CAPTURE_ARMED).read_text()
    assert said == "nsys start failed: Collection start is not allowed in this state."
    assert not watch.handed.is_set()


def test_a_worker_that_ends_before_its_stop_is_let_go_by_the_watch(nsys, tmp_path):
    nsys.state("RangeCollection")
    watch = handoff(nsys, tmp_path / "run")
    assert never(watch.handed, 0.5)
    watch.worker_ended.set()  # a crash: ForkedWorker.wait ends the collection itself
    watch.join(30)
    assert not watch.is_alive() and not watch.handed.is_set() and not watch.written.is_set()
