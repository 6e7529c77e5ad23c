"""The NeMo AutoModel backend (backend=automodel): the config groups mapped onto AutoModel's LLM
fine-tuning recipe (a Hugging Face model under FSDP2, LoRA, fp8 through torchao).

AutoModel is imported only where the recipe runs (automodel_train.py, in the worker);
`automodel_backend`, `checks` and `config` need none, so the job validates and the dry run prints
the recipe config anywhere.
"""
