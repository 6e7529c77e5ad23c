"""Tracking: runs, params, metrics and artifacts in MLflow."""
