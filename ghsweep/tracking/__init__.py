"""Tracking: runs, params, metrics and artifacts in MLflow."""

import os

# Set as the package is first imported, before MLflow is, and before a sweep starts its pre-imported
# worker (ghsweep.launch.warm_worker_client): a variable set later would make each run's environment
# differ from the one the worker imported in, and start it again.
# MLflow otherwise phones home at start-up; clusters' compute nodes often have no internet.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# A progress bar per downloaded artifact would bury a report's own output.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
