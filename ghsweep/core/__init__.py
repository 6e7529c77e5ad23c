"""Contracts every stage shares: run-file names, exceptions, GPU facts, run results, tags and metric
names. This package imports nothing else of ghsweep, so any stage may import it."""
