"""Benchmarks: our torch backend against the usual transformers + peft stack, side by side."""
