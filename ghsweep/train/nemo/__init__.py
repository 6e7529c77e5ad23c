"""The NeMo backend (backend=nemo): the config groups mapped onto NeMo 2's Llama-2 fine-tuning recipe.

Everything here imports NeMo, so only the worker (and the dry run) of a backend=nemo run import
this package; the base install and the torch backend never need NeMo.
"""
