"""The NeMo backend (backend=nemo): the config groups mapped onto NeMo 2's Llama-2 fine-tuning recipe.

NeMo is imported only where a recipe is built or run (nemo_train.py, in the worker, and the dry run of a
backend=nemo run); `nemo_backend` and `recipe.check_config` need none, so the job validates anywhere and
the base install and the torch backend never need NeMo.
"""
