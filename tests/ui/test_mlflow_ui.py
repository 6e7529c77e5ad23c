"""The MLflow UI shows a real sweep: Debian's chromium driven by playwright against a real
`mlflow server` on 127.0.0.1 that holds a real smoke sweep (logged by the real CLI).

Screenshots are saved under test-artifacts/ui/ (or $GHSWEEP_UI_SCREENSHOTS). The browser is the
system's /usr/bin/chromium (apt-get install chromium); `playwright install` is never run. Without
that browser the tests skip with the reason, unless CI=true: then they fail (tests/optional_env.py).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from ghsweep.core.names import EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND
from tests.optional_env import unavailable
from tests.support.cli import run_cli
from tests.support.mlflow_records import MlflowRecords
from tests.support.paths import REPO

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = Path(os.environ.get("GHSWEEP_UI_SCREENSHOTS", REPO / "test-artifacts" / "ui"))
EXPERIMENT = "ui_test"
METRICS = ("tokens_per_s", "step_time_ms")
UI_TIMEOUT_MS = 90_000
SWITCH_PRESSES = 4

if not CHROMIUM.exists():
    unavailable(f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium)", module_level=True)

from playwright.sync_api import Page, sync_playwright  # noqa: E402
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError  # noqa: E402


@pytest.fixture(scope="module")
def sweep(mlflow_server, tmp_path_factory):
    """A real 2-run smoke sweep logged to the session's tracking server."""
    proc = run_cli(
        [
            "-m",
            "experiment=smoke",
            "tracking=server",
            f"tracking.uri={mlflow_server.url}",
            f"tracking.experiment={EXPERIMENT}",
            "peft=lora,none",
            "precision=fp32",
            "train.max_steps=4",
        ],
        tmp_path_factory.mktemp("ui_sweep"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = MlflowRecords(mlflow_server.url, EXPERIMENT)
    (parent,) = records.runs("sweep")
    children = sorted(records.runs("run"), key=lambda r: int(r.data.tags["ghsweep.job_num"]))
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    return mlflow_server.url, records.experiment_id, parent, children, proc.stdout


@pytest.fixture(scope="module")
def browser():
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield b
        b.close()


def shown(value: float, texts: list[str]) -> bool:
    """Whether the page shows `value`, allowing the compare page's rounding (4 significant digits or 3 decimals)."""
    for text in texts:
        try:
            if abs(float(text.replace(",", "")) - value) <= 5e-4 * abs(value) + 5e-4:
                return True
        except ValueError:
            continue
    return False


def close_assistant(page: Page) -> None:
    # A fresh browser profile opens MLflow's assistant panel over the right side of the table.
    close = page.get_by_role("button", name="Close")
    if close.count():
        close.first.click()


def dismiss_tour(page: Page) -> None:
    # MLflow's first-visit tour of its GenAI overview: a popover over a mask of the whole page.
    got_it = page.get_by_role("button", name="Got it")
    if got_it.count() and got_it.first.is_visible():
        got_it.first.click()


def choose_column(page: Page, name: str) -> None:
    page.get_by_placeholder("Search columns").fill(name)
    node = page.locator("[class*='tree-treenode']").filter(has_text=re.compile(f"^{re.escape(name)}$")).last
    node.locator("[class*='tree-checkbox']").first.click()


def test_the_experiment_is_model_training_and_its_runs_are_one_switch_away(sweep, browser):
    """MLflow 3.17's UI opens every experiment in the browser's workflow view, GenAI by default (a
    switch at the top of the sidebar, kept per browser); the experiment's kind tag is what its
    views without that switch read. The README's path: open the experiment, press Model training."""
    url, exp_id, parent, _, _ = sweep
    records = MlflowRecords(url, EXPERIMENT)
    assert records.client.get_experiment(exp_id).tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND
    page = browser.new_page(viewport={"width": 1600, "height": 900})
    page.set_default_timeout(UI_TIMEOUT_MS)
    page.goto(f"{url}/#/experiments/{exp_id}")
    switch = page.get_by_text("Model training", exact=True).first
    switch.wait_for()
    parent_row = page.get_by_text(parent.info.run_name, exact=True)
    # A fresh profile's first-visit tour ("Detect Issues in Your Traces") masks the whole page, at a
    # moment of its own: a press then lands on the mask. Dismiss it as a user would, and press the switch
    # where the pointer reaches it, else on the element itself. On a loaded machine a press can come
    # before the page handles it, or the runs table can stay empty: press again, and the last time
    # reload the page first.
    for press in range(SWITCH_PRESSES):
        if press == SWITCH_PRESSES - 1:
            page.reload()
            switch.wait_for()
        dismiss_tour(page)
        try:
            switch.click(timeout=UI_TIMEOUT_MS / 9)
        except PlaywrightTimeoutError:
            switch.dispatch_event("click")
        try:
            parent_row.wait_for(timeout=UI_TIMEOUT_MS / 2)
            break
        except PlaywrightTimeoutError:
            continue
    else:
        page.screenshot(path=str(SHOTS / "experiment_without_its_sweep.png"))
        body = page.inner_text("body")
        raise AssertionError(
            f"{parent.info.run_name!r} not shown at {page.url} after {SWITCH_PRESSES} presses:\n{body[:3000]}"
        )
    assert "workflowType=machine_learning" in page.url
    close_assistant(page)
    page.screenshot(path=str(SHOTS / "experiment_in_model_training_view.png"))
    page.close()


def test_experiment_page_shows_parent_children_and_metric_values(sweep, browser):
    url, exp_id, parent, children, _ = sweep
    page = browser.new_page(viewport={"width": 1600, "height": 900})
    page.set_default_timeout(UI_TIMEOUT_MS)
    # workflowType: without it this MLflow opens the experiment in its GenAI mode.
    page.goto(f"{url}/#/experiments/{exp_id}/runs?workflowType=machine_learning")
    page.get_by_text(parent.info.run_name, exact=True).wait_for()
    close_assistant(page)
    for child in children:
        assert page.get_by_text(child.info.run_name, exact=True).count() == 0  # collapsed under the parent

    parent_cell = page.locator("[role=gridcell]").filter(has_text=parent.info.run_name).first
    parent_cell.locator("button").first.click()  # expand the sweep
    for child in children:
        page.get_by_text(child.info.run_name, exact=True).wait_for()

    page.get_by_role("button", name="Columns").click()
    for name in (*METRICS, "peft"):
        choose_column(page, name)
    page.keyboard.press("Escape")
    for name in METRICS:
        page.get_by_role("columnheader", name=name).first.wait_for()
    cells = page.locator("[role=gridcell]").all_inner_texts()
    for child in children:
        for name in METRICS:
            assert shown(child.data.metrics[name], cells), (name, child.data.metrics[name], cells)
    assert {"lora", "none"} <= {c.strip() for c in cells}
    page.screenshot(path=str(SHOTS / "experiment_runs.png"))
    page.close()


def test_compare_page_renders_params_and_metrics_of_the_children(sweep, browser):
    url, exp_id, _, children, _ = sweep
    page = browser.new_page(viewport={"width": 1600, "height": 3200})  # the page scrolls inside its own container
    page.set_default_timeout(UI_TIMEOUT_MS)
    ids = json.dumps([c.info.run_id for c in children])
    page.goto(f"{url}/#/compare-runs?runs={ids}&experiments={json.dumps([exp_id])}")
    page.get_by_text("Comparing 2 Runs").wait_for()
    grid = page.locator("div.ReactVirtualized__Grid").last
    grid.wait_for()
    lines = page.inner_text("body").splitlines()
    # Parameter rows list one value per run, in the order of the URL.
    for key in ("peft", "precision", "train.max_steps"):
        row = "\t".join([key, *(c.data.params[key] for c in children)])
        assert row in lines, (row, [line for line in lines if line.startswith(key)])
    page.screenshot(path=str(SHOTS / "compare_runs.png"), full_page=True)
    # MLflow 3.17 shows the metrics in a virtualised table some 6 rows high, alphabetical: a run has some
    # 40 metrics with the system metrics, so which rows show first depends on their names. Scroll it as a
    # user would with the wheel, a few rows at a time, and collect what each position shows.
    names = ("peak_mem_gb", "step_time_ms", "tokens_per_s")
    expected = [c.data.metrics[name] for c in children for name in names]
    grid.hover()
    seen: list[str] = []
    for _ in range(200):  # the rows render after each scroll event
        seen += page.inner_text("body").splitlines()
        if all(name in seen for name in names) and all(shown(value, seen) for value in expected):
            break
        page.mouse.wheel(0, 60)
        page.wait_for_timeout(100)
    else:
        missing = [name for name in names if name not in seen]
        raise AssertionError(f"the metrics table never showed {missing or names} with the runs' values {expected}")
    page.close()


def test_sweep_run_page_lists_the_comparison_report(sweep, browser):
    url, exp_id, parent, _, _ = sweep
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    page.set_default_timeout(UI_TIMEOUT_MS)
    page.goto(f"{url}/#/experiments/{exp_id}/runs/{parent.info.run_id}/artifacts")
    page.get_by_text("comparison", exact=True).first.wait_for()
    close_assistant(page)
    page.get_by_text("comparison", exact=True).first.click()
    page.get_by_text("comparison.html", exact=True).first.click()
    # MLflow renders an HTML artifact in an iframe; our report's verdict is inside it.
    frame = page.frame_locator("iframe").first
    frame.get_by_text("2 of 2 combinations finished.").wait_for()
    frame.get_by_text(re.compile(r"^Baseline: #0 lora")).wait_for()
    page.screenshot(path=str(SHOTS / "sweep_comparison_report.png"))
    page.close()


def test_the_printed_link_opens_the_sweep_with_its_verdict_and_report(sweep, browser):
    """The answer within two clicks: the link the sweep printed opens its parent run, whose description
    names the fastest combination; one click on its report link shows the comparison."""
    url, _, parent, children, stdout = sweep
    link = next(line.split("MLflow: ", 1)[1] for line in stdout.splitlines() if line.startswith("  MLflow: "))
    assert link.startswith(f"{url}/#/experiments/") and link.endswith("?workflowType=machine_learning"), link
    fastest = next(line for line in stdout.splitlines() if line.strip().startswith("Fastest: ")).strip()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(UI_TIMEOUT_MS)
    page.goto(link)
    page.get_by_text(fastest, exact=False).first.wait_for()
    close_assistant(page)
    page.screenshot(path=str(SHOTS / "sweep_verdict_in_mlflow.png"))
    assert fastest in page.inner_text("body")
    assert {c.info.run_name for c in children} == {"peft=lora", "peft=none"}
    link = page.get_by_role("link", name="comparison/comparison.html").first
    if link.get_attribute("target") == "_blank":  # the UI's markdown opens links in a new tab
        with page.expect_popup() as opened:
            link.click()
        report = opened.value
    else:
        link.click()
        report = page
    report.set_default_timeout(UI_TIMEOUT_MS)
    report.frame_locator("iframe").first.get_by_text("2 of 2 combinations finished.").wait_for()
    assert "workflowType=machine_learning" in report.url  # the report in the model-training view
    report.screenshot(path=str(SHOTS / "sweep_report_from_its_verdict.png"))
    page.context.close()
