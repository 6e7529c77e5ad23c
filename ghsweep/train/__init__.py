"""Training: the worker process and the backends it runs (torch, nemo, automodel), registered by
name in ghsweep.train.backends. Nothing here imports launch, tracking or report."""
