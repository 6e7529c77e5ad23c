"""ghsweep: Hydra-configured sweeps of LLM fine-tuning runs, profiled and recorded in MLflow."""

__version__ = "0.1.0"
