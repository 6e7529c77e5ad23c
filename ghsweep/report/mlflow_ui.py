"""Where a sweep's answer is in MLflow's UI: the parent run's page, and the description it opens with.

MLflow 3.17's UI opens an experiment in the view the browser last chose, GenAI unless switched (it
reads the `workflowType` of the URL before its own choice, and not the experiment's kind tag), so the
link given names the model-training view.
"""

from __future__ import annotations

import re

from ghsweep.core.run_dir import COMPARISON_DIR, COMPARISON_STEM
from ghsweep.tracking import redact

# Where `mlflow ui` serves by default: a SQLite store has no server of its own.
LOCAL_UI = "http://127.0.0.1:5000"
# The model-training view, named in every link (the UI's markdown opens a link in a new tab, which
# would take the browser's own choice).
VIEW = "?workflowType=machine_learning"
# The verdict's Pareto line explains the front in parentheses; the report keeps the explanation.
PARETO = re.compile(r"^Pareto front \(.*\):")


def served(tracking_uri: str) -> bool:
    """Whether the store is a tracking server, whose address is its UI's."""
    return tracking_uri.startswith(("http://", "https://"))


def run_page(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """The run's page in the UI of the store at `tracking_uri` (a local `mlflow ui` for a SQLite store)."""
    base = tracking_uri.rstrip("/") if served(tracking_uri) else LOCAL_UI
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}{VIEW}"


def how_to_open(tracking_uri: str, experiment_id: str, run_id: str) -> list[str]:
    """The lines that say how to see the run in the UI: the server to start (for a store without one), the
    link; a password in the URI shown as ***."""
    start = [] if served(tracking_uri) else [f"mlflow ui --backend-store-uri {tracking_uri}"]
    return [redact.text(line) for line in [*start, run_page(tracking_uri, experiment_id, run_id)]]


def sweep_note(verdict: list[str], experiment_id: str, run_id: str) -> str:
    """The parent run's description, two paragraphs: the UI folds a longer one under a "Show more" whose
    shade takes the clicks meant for its links. The fastest first; then the Pareto front and the link
    to the report, which holds the whole verdict."""
    fastest = [f"**{line}**" for line in verdict if line.startswith("Fastest:")]
    pareto = [PARETO.sub("Pareto front:", line) for line in verdict if line.startswith("Pareto front")]
    report = f"#/experiments/{experiment_id}/runs/{run_id}/artifacts/{COMPARISON_DIR}/{COMPARISON_STEM}.html{VIEW}"
    link = f"Report, plots included: [{COMPARISON_DIR}/{COMPARISON_STEM}.html]({report})"
    return "\n\n".join([*fastest, " ".join([*pareto, link])])
