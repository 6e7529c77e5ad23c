"""Where a sweep's answer is in MLflow's UI: the link the sweep prints and the parent run's description."""

from __future__ import annotations

from ghsweep.report.mlflow_ui import how_to_open, sweep_note

VERDICT = [
    "2 of 2 combinations finished.",
    "Baseline: #0 fp32 (44 tokens/s).",
    "Fastest: #1 bf16: 1.30x (95% interval 1.29-1.31x) against the baseline.",
    "Pareto front (...): #1 bf16.",
]


def test_a_sqlite_store_says_how_to_start_its_ui_and_where_to_look():
    assert how_to_open("sqlite:////home/me/mlflow.db", "1", "abc") == [
        "mlflow ui --backend-store-uri sqlite:////home/me/mlflow.db",
        "http://127.0.0.1:5000/#/experiments/1/runs/abc?workflowType=machine_learning",
    ]


def test_a_servers_link_is_on_the_server_without_its_password():
    assert how_to_open("http://alice:s3cr3t@host:5000/", "7", "abc") == [
        "http://alice:***@host:5000/#/experiments/7/runs/abc?workflowType=machine_learning"
    ]


def test_the_description_leads_with_the_fastest_and_links_the_report():
    assert sweep_note(VERDICT, "1", "abc").split("\n\n") == [
        "**Fastest: #1 bf16: 1.30x (95% interval 1.29-1.31x) against the baseline.**",
        "Pareto front: #1 bf16. Report, plots included: "
        "[comparison/comparison.html](#/experiments/1/runs/abc/artifacts/comparison/comparison.html"
        "?workflowType=machine_learning)",
    ]
