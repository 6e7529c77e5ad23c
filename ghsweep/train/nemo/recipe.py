"""The config groups mapped onto NeMo 2's `llm.llama2_7b.finetune_recipe`.

`check_config` needs no NeMo (the job process calls it before submission); everything that builds
or reads a recipe imports NeMo lazily, inside the function.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ghsweep.config.model_facts import model_facts
from ghsweep.config.schema import (
    BackendSchema,
    ConfigSchema,
    ModelSchema,
    PeftSchema,
    TrainSchema,
    accepted,
    capture_steps,
    carried,
    check,
    choices,
)
from ghsweep.core.errors import ConfigError
from ghsweep.core.run_dir import METRICS, RECIPE_JSON, RECIPE_TXT
from ghsweep.train.flops import ModelShape
from ghsweep.train.nemo.compat import use_local_spec
from ghsweep.train.schedule import warmup_steps

# LoRA targets: transformers' module names -> Megatron's fused linear layers. Megatron fuses
# q/k/v into one GEMM and gate/up into another, so a LoRA target is all of a group or none of it.
LORA_MODULE_GROUPS = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
}
# The dolly records converted to NeMo's fine-tuning format ({"input", "output"} per line).
DATASET_DIR = "nemo_data"


def transformer_engine_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def lora_target_modules(targets: list[str]) -> list[str]:
    """Megatron's names for the transformers module names in `targets` (`peft.target_modules`)."""
    chosen = set(targets)
    names = []
    for fused, parts in LORA_MODULE_GROUPS.items():
        present = [p for p in parts if p in chosen]
        if present and len(present) != len(parts):
            raise ConfigError(
                f"peft.target_modules={sorted(chosen)}: with backend=nemo {', '.join(parts)} are one fused "
                f"layer ({fused}) and take LoRA together; accepted: all of them or none"
            )
        if present:
            names.append(fused)
    return names


@dataclass(frozen=True)
class Layout:
    """backend=nemo's GPUs and their split into tensor and pipeline parallel ranks."""

    num_nodes: int
    gpus_per_node: int
    tensor_parallel: int
    pipeline_parallel: int

    @property
    def gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


def layout(backend: BackendSchema) -> Layout:
    """backend=nemo's layout, its knobs checked against the schema."""
    check("backend.num_nodes", backend.num_nodes)
    check("backend.gpus_per_node", backend.gpus_per_node)
    check("backend.tensor_parallel", backend.tensor_parallel)
    check("backend.pipeline_parallel", backend.pipeline_parallel)
    return Layout(
        carried(backend.num_nodes, "backend.num_nodes"),
        carried(backend.gpus_per_node, "backend.gpus_per_node"),
        carried(backend.tensor_parallel, "backend.tensor_parallel"),
        carried(backend.pipeline_parallel, "backend.pipeline_parallel"),
    )


def lora_targets(peft: PeftSchema) -> list[str]:
    """Megatron's names for peft=lora's target modules."""
    return lora_target_modules(carried(peft.target_modules, "peft.target_modules"))


def check_config(config: ConfigSchema, runtime: bool) -> None:
    """Raise ConfigError for what NeMo/Megatron would refuse, before any GPU time.

    `runtime`: this interpreter is the one the worker trains in, so installed packages
    (Transformer Engine for fp8) can be checked here too.
    """
    b = config.backend
    run = layout(b)
    check("backend.recompute_granularity", b.recompute_granularity)
    if run.gpus % (run.tensor_parallel * run.pipeline_parallel):
        raise ConfigError(
            f"backend.tensor_parallel={run.tensor_parallel}: tensor x pipeline parallel "
            f"({run.tensor_parallel * run.pipeline_parallel}) must divide the run's {run.gpus} GPUs "
            "(backend.num_nodes x backend.gpus_per_node)"
        )
    if b.recompute_granularity == "full" and b.recompute_method is None:
        raise ConfigError(
            f"backend.recompute_method={b.recompute_method}: recompute_granularity=full needs one; "
            f"accepted: {accepted(choices('backend.recompute_method'))}"
        )
    check("backend.recompute_method", b.recompute_method)
    check("backend.recompute_num_layers", b.recompute_num_layers)
    if config.peft.name == "lora":
        lora_targets(config.peft)
    model = model_facts(config.model)
    layers = model.num_layers
    if config.offload.enabled:
        if config.offload.num_layers >= layers:
            raise ConfigError(
                f"offload.num_layers={config.offload.num_layers}: with backend=nemo Megatron offloads fewer "
                f"layers than {model.source} has ({layers}); accepted: 1 to {layers - 1}"
            )
        if run.pipeline_parallel > 1:
            raise ConfigError(
                f"backend.pipeline_parallel={run.pipeline_parallel}: Megatron has no CPU offloading with "
                "pipeline parallelism; accepted with offload=on: 1"
            )
        if b.recompute_granularity is not None:
            raise ConfigError(
                f"backend.recompute_granularity={b.recompute_granularity}: Megatron refuses activation "
                "recomputation together with offload=on; accepted with offload=on: null"
            )
    if config.train.optimizer != "auto":
        raise ConfigError(
            f"train.optimizer={config.train.optimizer}: NeMo steps Megatron's distributed Adam over fp32 master "
            "weights; accepted with backend=nemo: auto"
        )
    if config.data.packing_mask != "document":
        raise ConfigError(
            f"data.packing_mask={config.data.packing_mask}: NeMo's packed sequences always keep each example to "
            "itself; accepted with backend=nemo: document"
        )
    if config.dataloader.prefetch_factor not in (None, 2):
        raise ConfigError(
            f"dataloader.prefetch_factor={config.dataloader.prefetch_factor}: NeMo's data module always "
            "uses PyTorch's default; accepted with backend=nemo: null, 2"
        )
    if config.precision.name == "fp8":
        if config.precision.library not in ("auto", "te"):
            raise ConfigError(
                f"precision.library={config.precision.library}: NeMo's fp8 is Transformer Engine's; "
                "accepted with backend=nemo: auto, te"
            )
        if runtime and not transformer_engine_available():
            raise ConfigError(
                "precision=fp8: backend=nemo needs Transformer Engine (import transformer_engine) and "
                "this environment has none (the NeMo container has it); accepted here: fp32, fp16, bf16"
            )


def data_parallel_size(config: ConfigSchema) -> int:
    run = layout(config.backend)
    return run.gpus // (run.tensor_parallel * run.pipeline_parallel)


def tokens_per_step(config: ConfigSchema) -> int:
    """Tokens of one global batch: every micro-batch is packed full (see `build_recipe`)."""
    return config.train.micro_batch_size * config.train.seq_length * data_parallel_size(config)


def build_recipe(config: ConfigSchema, run_dir: Path) -> Any:
    """The `run.Partial` of `llm.finetune` that trains `config`, logging into `run_dir`."""
    from nemo.collections import llm

    b = config.backend
    # The torch backend packs examples into micro-batches of exactly seq_length tokens; NeMo packs
    # into one sequence per micro-batch, so the same tokens per step are one packed sequence of
    # micro_batch_size x seq_length (NeMo's own advice for packed micro-batches > 1).
    packed_length = config.train.micro_batch_size * config.train.seq_length
    recipe = llm.llama2_7b.finetune_recipe(
        dir=str(run_dir / "nemo"),
        name="ghsweep",
        num_nodes=b.num_nodes,
        num_gpus_per_node=b.gpus_per_node,
        peft_scheme="lora" if config.peft.name == "lora" else None,
        seq_length=packed_length,
        packed_sequence=True,
    )
    _map_model(recipe, config)
    _map_peft(recipe, config)
    _map_precision(recipe, config)
    _map_offload(recipe, config)
    _map_data(recipe, config, run_dir, packed_length)
    _map_train(recipe, config, run_dir)
    return recipe


def _map_model(recipe: Any, config: ConfigSchema) -> None:
    import nemo_run as run
    from nemo import lightning as nl
    from nemo.collections.common.tokenizers.bytelevel_tokenizers import ByteLevelTokenizer
    from nemo.collections.common.tokenizers.huggingface.auto_tokenizer import AutoTokenizer

    m = config.model
    c = recipe.model.config
    if not transformer_engine_available():
        use_local_spec(c)
    arch = llama_architecture(m)
    c.num_layers = arch["num_hidden_layers"]
    c.hidden_size = arch["hidden_size"]
    c.ffn_hidden_size = arch["intermediate_size"]
    c.num_attention_heads = arch["num_attention_heads"]
    c.num_query_groups = arch["num_key_value_heads"]
    c.layernorm_epsilon = arch["rms_norm_eps"]
    c.rotary_base = arch["rope_theta"]
    c.share_embeddings_and_output_weights = arch["tie_word_embeddings"]
    if m.path:
        # A Hugging Face folder: the worker converts it once into NeMo's model cache (`hf_import_path`),
        # into a model of this config. NeMo pads the vocabulary to a multiple of this divisor; its
        # importer picks one that leaves the checkpoint's vocabulary unpadded, and so must training.
        c.make_vocab_size_divisible_by = vocab_divisor(arch["vocab_size"])
        recipe.model.tokenizer = run.Config(AutoTokenizer, pretrained_model_name=str(m.path))
        recipe.resume = run.Config(
            nl.AutoResume, restore_config=run.Config(nl.RestoreConfig, path=str(hf_import_path(m.path)))
        )
    else:
        # Random weights of the configured shape, byte-level tokens (no vocabulary to download),
        # the configured vocabulary size so the output layer costs what the real one does.
        c.vocab_size = arch["vocab_size"]
        recipe.model.tokenizer = run.Config(ByteLevelTokenizer, vocab_size=256)
        recipe.resume = None


def llama_architecture(model: ModelSchema) -> dict[str, Any]:
    """The trained Llama's shape in Hugging Face's names: the checkpoint's config.json with `model.path`
    (NeMo imports the checkpoint with it), else the model config."""
    if not model.path:
        return {
            "num_hidden_layers": model.num_layers,
            "hidden_size": model.hidden_size,
            "intermediate_size": model.intermediate_size,
            "num_attention_heads": model.num_attention_heads,
            "num_key_value_heads": model.num_key_value_heads,
            "rms_norm_eps": model.rms_norm_eps,
            "vocab_size": model.vocab_size,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
        }
    hf = json.loads((Path(model.path) / "config.json").read_text())
    # transformers >= 5 writes rope_theta inside rope_parameters.
    rope = hf.get("rope_parameters") or {}
    return {
        "num_hidden_layers": hf["num_hidden_layers"],
        "hidden_size": hf["hidden_size"],
        "intermediate_size": hf["intermediate_size"],
        "num_attention_heads": hf["num_attention_heads"],
        "num_key_value_heads": hf.get("num_key_value_heads") or hf["num_attention_heads"],
        "rms_norm_eps": hf["rms_norm_eps"],
        "vocab_size": hf["vocab_size"],
        "rope_theta": float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
    }


def model_shape(model: ModelSchema) -> ModelShape:
    """The FLOPs-relevant shape of `llama_architecture(model)`."""
    return ModelShape.from_hf(llama_architecture(model))


def vocab_divisor(vocab_size: int) -> int:
    """The largest power of two up to 128 that divides `vocab_size` (NeMo's Llama importer's rule)."""
    divisor = 128
    while vocab_size % divisor:
        divisor //= 2
    return divisor


def llama_folder_importer(folder: str, model_config: Any) -> Any:
    """NeMo's Hugging Face Llama importer for `folder`, converting into a model of `model_config`
    (the recipe's, built), kept in the checkpoint's dtype: the model the run trains, on the layers it
    trains on. NeMo's own importer derives the config from the checkpoint itself, with Transformer
    Engine's defaults and transformers 4's config attributes."""
    import dataclasses

    import torch
    from nemo.collections.llm.gpt.model.llama import HFLlamaImporter

    dtype = getattr(torch, json.loads((Path(folder) / "config.json").read_text()).get("torch_dtype") or "float32")
    config = dataclasses.replace(
        model_config, params_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16
    )

    class LlamaFolderImporter(HFLlamaImporter):
        @property
        def config(self) -> Any:
            return config

        def convert_state(self, source: Any, target: Any) -> Any:
            converted = super().convert_state(source, target)
            if not transformer_engine_available():
                copy_local_layer_norms(source, converted)
            return converted

    return LlamaFolderImporter(folder)


# Megatron's local layer norms -> the Hugging Face Llama layer's.
LOCAL_NORM = re.compile(r"decoder\.layers\.(\d+)\.(input_layernorm|pre_mlp_layernorm)\.weight$")
HF_NORM = {"input_layernorm": "input_layernorm", "pre_mlp_layernorm": "post_attention_layernorm"}


def copy_local_layer_norms(source: Any, target: Any) -> None:
    """The decoder layers' RMSNorm weights of the Hugging Face model `source` into NeMo's `target` on
    Megatron's local layers. NeMo's importer maps them onto Transformer Engine's fused
    norm+linear layers only, and without those leaves them at their initial value (with a warning)."""
    import torch

    with torch.no_grad():
        for name, param in target.named_parameters():
            if match := LOCAL_NORM.search(name):
                param.copy_(getattr(source.model.layers[int(match[1])], HF_NORM[match[2]]).weight)


def hf_import_path(model_path: str) -> Path:
    """Where `llm.import_ckpt(model, "hf://" + model_path)` puts its NeMo checkpoint (NeMo's rule)."""
    from nemo.lightning.base import NEMO_MODELS_CACHE

    return Path(NEMO_MODELS_CACHE) / Path(model_path).name


def _map_peft(recipe: Any, config: ConfigSchema) -> None:
    # The recipe sets tensor parallel 2 for full fine-tuning; the run's layout is backend's.
    recipe.trainer.strategy.tensor_model_parallel_size = config.backend.tensor_parallel
    recipe.trainer.strategy.pipeline_model_parallel_size = config.backend.pipeline_parallel
    if config.peft.name != "lora":
        return
    p = config.peft
    recipe.peft.dim = p.r
    recipe.peft.alpha = p.alpha
    recipe.peft.dropout = p.dropout
    recipe.peft.target_modules = lora_targets(p)


def _map_precision(recipe: Any, config: ConfigSchema) -> None:
    recipe.trainer.plugins = _precision_plugin(config)
    # MegatronMixedPrecision asserts that the optimizer's dtype flags match its own.
    recipe.optim.config.bf16 = config.precision.name in ("bf16", "fp8")
    recipe.optim.config.fp16 = config.precision.name == "fp16"


def _precision_plugin(config: ConfigSchema) -> Any:
    import nemo_run as run
    import torch
    from nemo.collections.llm.recipes.precision import mixed_precision as mp
    from nemo.lightning.pytorch.plugins.mixed_precision import MegatronMixedPrecision

    p = config.precision
    if p.name == "fp32":
        return run.Config(
            MegatronMixedPrecision,
            precision="32",
            params_dtype=torch.float32,
            pipeline_dtype=torch.float32,
            autocast_enabled=False,
            grad_reduce_in_fp32=True,
        )
    if p.name == "fp16":
        plugin = mp.fp16_mixed()
        plugin.fp16_initial_loss_scale = p.initial_loss_scale
        return plugin
    if p.name == "bf16":
        return mp.bf16_mixed()
    plugin = mp.bf16_with_fp8_mixed() if p.scaling == "delayed" else mp.bf16_with_fp8_current_scaling_mixed()
    plugin.fp8 = p.format
    return plugin


def _map_offload(recipe: Any, config: ConfigSchema) -> None:
    c = recipe.model.config
    o = config.offload
    c.cpu_offloading = o.enabled
    c.cpu_offloading_num_layers = o.num_layers if o.enabled else 0
    # ghsweep's offload is activation offloading; the weights stay on the GPU.
    c.cpu_offloading_activations = o.enabled
    c.cpu_offloading_weights = False
    b = config.backend
    c.recompute_granularity = b.recompute_granularity
    c.recompute_method = b.recompute_method
    c.recompute_num_layers = b.recompute_num_layers


def _map_data(recipe: Any, config: ConfigSchema, run_dir: Path, packed_length: int) -> None:
    import nemo_run as run
    from nemo.collections import llm
    from nemo.collections.llm.gpt.data.packed_sequence import PackedSequenceSpecs

    dl = config.dataloader
    recipe.data = run.Config(
        llm.FineTuningDataModule,
        dataset_root=str(run_dir / DATASET_DIR),
        seq_length=packed_length,
        micro_batch_size=1,
        global_batch_size=data_parallel_size(config),
        seed=config.seed,
        num_workers=dl.num_workers,
        pin_memory=dl.pin_memory,
        persistent_workers=dl.persistent_workers and dl.num_workers > 0,
        # NeMo names the packed file's folder after the tokenizer, or `hash(tokenizer)` for one it
        # does not know (the byte-level one): a different folder in every rank's process, so with
        # several ranks only rank 0's is ever written and the others fail to load theirs.
        packed_sequence_specs=run.Config(
            PackedSequenceSpecs,
            packed_sequence_size=packed_length,
            tokenizer_model_name=Path(config.model.path).name if config.model.path else "byte_level",
        ),
        dataset_kwargs={"pad_to_max_length": True},
    )


def lr_scheduler(train: TrainSchema) -> tuple[type, dict[str, Any]]:
    """The torch backend's schedule (schedule.lr_factor) as NeMo's scheduler module and its settings.

    NeMo's warm-up trains step k (from 0) at lr * (k + 1) / (warmup_steps + 1): with one warm-up
    step fewer that is the torch backend's lr * (k + 1) / warmup. Its decay then ends at min_lr on
    the last step as the torch backend's does, its midpoint within a step of it.
    """
    from nemo.lightning.pytorch.optim import (
        CosineAnnealingScheduler,
        WarmupAnnealingScheduler,
        WarmupPolicyScheduler,
    )

    warmup = warmup_steps(train.max_steps, train.lr_warmup_ratio)
    settings: dict[str, Any] = {
        "warmup_steps": max(0, warmup - 1),
        "max_steps": train.max_steps - 1,
        "min_lr": train.lr * train.min_lr_ratio,
    }
    if train.lr_schedule == "cosine":
        # constant_steps: NeMo's default (80,000) would hold the peak rate instead of decaying.
        return CosineAnnealingScheduler, {**settings, "constant_steps": 0}
    return (WarmupAnnealingScheduler if train.lr_schedule == "linear" else WarmupPolicyScheduler), settings


def _map_train(recipe: Any, config: ConfigSchema, run_dir: Path) -> None:
    import fiddle as fdl
    import nemo_run as run
    from nemo.lightning.pytorch.callbacks.garbage_collection import GarbageCollectionCallback
    from nemo.lightning.pytorch.callbacks.nsys import NsysCallback

    from ghsweep.train.nemo.megatron_optimizer import MegatronOptimizerWithFusedTorchAdam, megatron_uses_torch_adam
    from ghsweep.train.nemo.metrics import StepMetricsCallback

    t = config.train
    trainer = recipe.trainer
    trainer.max_steps = t.max_steps
    trainer.log_every_n_steps = t.log_every
    # ghsweep measures training steps: no validation passes, no checkpoints in between.
    trainer.limit_val_batches = 0
    trainer.val_check_interval = None
    trainer.enable_checkpointing = False
    # NeMo's asynchronous checkpoint wrapper is built even when nothing is saved, and it imports
    # megatron-core's tensorstore strategy (gone from megatron-core 0.16; an optional package before).
    trainer.strategy.ckpt_async_save = False
    recipe.log.ckpt = None
    recipe.log.tensorboard = None
    recipe.optim.config.lr = t.lr
    recipe.optim.config.weight_decay = t.weight_decay
    # Megatron clips only above 0.
    recipe.optim.config.clip_grad = 0.0 if t.grad_clip is None else t.grad_clip
    scheduler, settings = lr_scheduler(t)
    recipe.optim.lr_scheduler = run.Config(scheduler, **settings)
    if megatron_uses_torch_adam():
        fdl.update_callable(recipe.optim, MegatronOptimizerWithFusedTorchAdam)
    # NsysCallback stops after the batch of its end_step: capture.num_steps steps from start_step.
    window = capture_steps(config.capture, t.max_steps)
    callbacks = [
        *(trainer.callbacks or []),
        run.Config(
            NsysCallback,
            start_step=window.start,
            end_step=window[-1],
            ranks=[0],
        ),
        run.Config(
            StepMetricsCallback,
            metrics_path=str(run_dir / METRICS),
            tokens_per_step=tokens_per_step(config),
            max_steps=t.max_steps,
            log_every=t.log_every,
        ),
    ]
    if t.gc_interval is not None:
        # NeMo's own: automatic collection off, a full one every gc_interval steps (no validation runs here).
        callbacks.append(
            run.Config(GarbageCollectionCallback, gc_interval_train=t.gc_interval, gc_interval_val=t.gc_interval)
        )
    trainer.callbacks = callbacks


def save_recipe(recipe: Any, run_dir: Path) -> str:
    """Write the recipe into `run_dir` as NeMo-Run prints it and as fiddle JSON (reloadable with
    `load_recipe`); return the text."""
    from fiddle._src.experimental import serialization

    text = str(recipe)
    (run_dir / RECIPE_TXT).write_text(text + "\n")
    (run_dir / RECIPE_JSON).write_text(serialization.dump_json(recipe, indent=1))
    return text


def load_recipe(run_dir: Path) -> Any:
    from fiddle._src.experimental import serialization

    return serialization.load_json((run_dir / RECIPE_JSON).read_text())


def describe_recipe(config: ConfigSchema, run_dir: Path) -> str:
    """The dry run of a backend=nemo combination: its composed recipe, kept in `run_dir` too."""
    try:
        check_config(config, runtime=False)
    except ConfigError as exc:
        return f"  recipe:  (not runnable) {exc}"
    try:
        import nemo.collections.llm  # noqa: F401
    except ImportError as exc:
        return (
            f"  recipe:  (not composed) NeMo does not import here ({exc}); run the dry run where it does: "
            "the NeMo container, or the environment tests/nemo/make_env.sh builds"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    text = save_recipe(build_recipe(config, run_dir), run_dir)
    return f"  recipe:  {run_dir / RECIPE_JSON}\n" + "\n".join("    " + line for line in text.splitlines())
