"""A screenshot of MLflow's System metrics view of one run of a store:
    python3 benchmarks/system_metrics_screenshot.py STORE_DIR [RUN_NAME_PART] [OUT_PNG]
STORE_DIR holds mlflow.db (as benchmarks/hardware_metrics.sh leaves it in its results folder). The first
finished run whose name contains RUN_NAME_PART (default: any run with system metrics) is shown in a real
`mlflow server` on 127.0.0.1 through Debian's chromium (/usr/bin/chromium, headless); the PNG goes to
OUT_PNG (default STORE_DIR/system_metrics.png)."""

from __future__ import annotations

import sys
from pathlib import Path

from mlflow.tracking import MlflowClient
from playwright.sync_api import sync_playwright

from ghsweep.tracking.server import start_server

PORT = 5077


def main(argv: list[str]) -> int:
    store = Path(argv[1]).resolve()
    part = argv[2] if len(argv) > 2 else ""
    png = Path(argv[3]) if len(argv) > 3 else store / "system_metrics.png"
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    runs = [
        r
        for e in client.search_experiments()
        for r in client.search_runs([e.experiment_id], "attributes.status = 'FINISHED'")
        if part in r.info.run_name and any(k.startswith("system/") for k in r.data.metrics)
    ]
    if not runs:
        print(f"no finished run with system metrics whose name contains {part!r} in {store / 'mlflow.db'}")
        return 1
    run = runs[0]
    server = start_server(store, port=PORT)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
            page = browser.new_page(viewport={"width": 1600, "height": 1800})
            page.goto(f"{server.url}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}/system-metrics")
            page.get_by_text("gpu_0_utilization_percentage").or_(
                page.get_by_text("cpu_utilization_percentage")
            ).first.wait_for(timeout=90_000)
            close = page.get_by_role("button", name="Close")
            if close.count():
                close.first.click()
            page.wait_for_timeout(3000)  # the charts draw after their data arrives
            page.screenshot(path=str(png), full_page=True)
            browser.close()
    finally:
        server.stop()
    print(f"{run.info.run_name}: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
