"""Bad input gets one clear line naming the key, the value and what is accepted."""

from __future__ import annotations

import importlib.util

import pytest

from ghsweep.config.validate import validate
from ghsweep.core.errors import ConfigError
from ghsweep.core.gpu import GpuInfo
from tests.support.compose import compose_config as composed

H100 = GpuInfo("NVIDIA H100", (9, 0), 80.0, 79.0)
A100 = GpuInfo("NVIDIA A100-SXM4-80GB", (8, 0), 80.0, 79.0)


def error_of(cfg, gpu=None) -> str:
    with pytest.raises(ConfigError) as err:
        validate(cfg, gpu)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_defaults_are_valid_on_cpu_and_gpu():
    validate(composed(), None)
    validate(composed(), H100)


@pytest.mark.parametrize("r", [0, -4])
def test_lora_rank_must_be_positive(r):
    msg = error_of(composed(f"peft.r={r}"))
    assert msg.startswith(f"peft.r={r}:") and ">= 1" in msg


def test_negative_num_workers():
    msg = error_of(composed("dataloader.num_workers=-1"))
    assert msg.startswith("dataloader.num_workers=-1:") and ">= 0" in msg


def test_unknown_lora_target_lists_the_model_modules():
    msg = error_of(composed("peft.target_modules=[q_proj,qkv_proj]"))
    assert "'qkv_proj'" in msg and "model=tiny_llama" in msg
    assert "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj" in msg


def test_fp8_without_gpu():
    msg = error_of(composed("precision=fp8"))
    assert msg.startswith("precision=fp8:") and "8.9" in msg and "fp32, fp16, bf16" in msg


def test_fp8_on_gpu_too_old():
    msg = error_of(composed("precision=fp8"), A100)
    assert "NVIDIA A100-SXM4-80GB" in msg and "compute capability 8.0" in msg


def test_fp8_on_hopper_is_valid():
    validate(composed("precision=fp8"), H100)


def test_fp8_on_gpu_machine_but_cpu_device():
    msg = error_of(composed("precision=fp8", "device=cpu"), H100)
    assert "device=cpu" in msg


def test_unified_memory_without_cuda():
    msg = error_of(composed("memory=unified"))
    assert msg.startswith("memory=unified:") and "memory=device" in msg


def test_offload_more_layers_than_model():
    msg = error_of(composed("offload=on", "offload.num_layers=8"))
    assert msg.startswith("offload.num_layers=8:") and "only 4 layers" in msg and "1 to 4" in msg


def test_offload_prefetch_is_auto_or_a_positive_number_of_layers():
    for bad in ("0", "soon"):
        msg = error_of(composed("offload=on", f"offload.prefetch_layers={bad}"))
        assert msg == f"offload.prefetch_layers={bad}: not an accepted value; accepted: an integer >= 1, auto"
    validate(composed("offload=on", "offload.prefetch_layers=2"), None)


def test_offload_fits_larger_model():
    validate(composed("offload=on", "offload.num_layers=8", "model=llama2_7b"), H100)


def test_cuda_device_without_gpu():
    msg = error_of(composed("device=cuda"))
    assert msg.startswith("device=cuda:")


def test_seq_length_beyond_model():
    msg = error_of(composed("train.seq_length=4096"))
    assert "train.seq_length=4096" in msg and "8 to 2048" in msg


def test_missing_data_file(tmp_path):
    msg = error_of(composed("data=dolly_file", f"data.path={tmp_path}/nope.jsonl"))
    assert "nope.jsonl" in msg


def hf_config_folder(tmp_path, **fields):
    """A model folder as far as validation reads it: config.json written by save_pretrained."""
    import json

    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "num_hidden_layers": 2, "max_position_embeddings": 512, **fields})
    )
    return tmp_path


def test_model_folder_shape_wins_over_the_model_yaml(tmp_path):
    # llama2_7b.yaml says 32 layers and 4096 positions; the folder's checkpoint has 2 and 512.
    folder = hf_config_folder(tmp_path)
    msg = error_of(composed("model=llama2_7b", f"model.path={folder}", "offload=on", "offload.num_layers=8"))
    assert msg.startswith("offload.num_layers=8:") and f"model.path={folder} has only 2 layers" in msg
    msg = error_of(composed("model=llama2_7b", f"model.path={folder}", "train.seq_length=1024"))
    assert "train.seq_length=1024" in msg and "8 to 512" in msg
    validate(
        composed(
            "model=llama2_7b", f"model.path={folder}", "train.seq_length=512", "offload=on", "offload.num_layers=2"
        ),
        None,
    )


def test_model_folder_of_another_architecture(tmp_path):
    folder = hf_config_folder(tmp_path, model_type="gpt2")
    msg = error_of(composed(f"model.path={folder}"))
    assert "model_type=gpt2" in msg and "accepted: llama" in msg


def test_model_folder_without_config_json(tmp_path):
    msg = error_of(composed(f"model.path={tmp_path}"))
    assert f"model.path={tmp_path}: config.json is missing" in msg


def test_model_folder_that_does_not_exist(tmp_path):
    msg = error_of(composed(f"model.path={tmp_path}/nope"))
    assert "nope: no such folder" in msg


def test_learning_rate_comes_from_the_model_and_peft():
    assert composed("model=llama2_7b").train.lr == 1e-4
    assert composed("model=llama2_7b", "peft=none").train.lr == 5e-6
    assert composed("model=llama2_7b", "train.lr=3e-4").train.lr == 3e-4


def test_a_model_without_a_rate_for_this_peft_names_the_keys():
    msg = error_of(composed("~model.lr"))
    assert msg.startswith("train.lr:") and "model.lr.lora" in msg and "train.lr=RATE" in msg


@pytest.mark.parametrize(
    "override, start, accepted",
    [
        ("train.lr=0", "train.lr=0:", "> 0"),
        ("train.lr_schedule=step", "train.lr_schedule=step:", "cosine, linear, constant"),
        ("train.lr_warmup_ratio=1.5", "train.lr_warmup_ratio=1.5:", "<= 1"),
        ("train.grad_clip=-1", "train.grad_clip=-1:", "> 0"),
        ("train.activation_memory_budget=1.5", "train.activation_memory_budget=1.5:", "<= 1"),
        ("train.optimizer_in_backward=maybe", "train.optimizer_in_backward=maybe:", "True, False"),
        ("data.mean_tokens=0", "data.mean_tokens=0:", "> 0"),
        ("system_metrics.interval_s=0", "system_metrics.interval_s=0:", "> 0"),
        ("seed=-1", "seed=-1:", ">= 0"),
        ("repeat=0", "repeat=0:", ">= 1"),
    ],
)
def test_training_settings_out_of_range(override, start, accepted):
    msg = error_of(composed(override))
    assert msg.startswith(start) and accepted in msg


def test_flex_attention_needs_document_masking_on_a_gpu():
    validate(composed("train.attention=flex"), H100)
    msg = error_of(composed("train.attention=flex"))
    assert (
        msg.startswith("train.attention=flex:")
        and "device=auto" in msg
        and "flex" not in msg.split("accepted here:")[1]
    )
    msg = error_of(composed("train.attention=flex", "data.packing_mask=causal"), H100)
    assert "data.packing_mask=causal" in msg


def test_activation_memory_budget_needs_compiled_layers():
    validate(composed("train.activation_memory_budget=0.5"), H100)
    validate(composed("train.activation_memory_budget=0.5", "train.compile=true"), None)
    msg = error_of(composed("train.activation_memory_budget=0.5"))
    assert msg.startswith("train.activation_memory_budget=0.5:") and "train.compile=auto, device=auto" in msg
    assert "train.compile=true" in msg.split("accepted here:")[1]
    assert "train.compile=False" in error_of(
        composed("train.activation_memory_budget=0.5", "train.compile=false"), H100
    )


def test_optimizer_in_backward_refuses_fp16_loss_scaling():
    validate(composed("train.optimizer_in_backward=true", "precision=bf16"), None)
    msg = error_of(composed("train.optimizer_in_backward=true", "precision=fp16"))
    assert msg.startswith("train.optimizer_in_backward=true:") and "accepted with precision=fp16: false" in msg


def test_stochastic_rounding_needs_bf16_weights():
    validate(composed("train.optimizer=adamw_sr", "precision=fp8"), H100)
    msg = error_of(composed("train.optimizer=adamw_sr", "precision=fp16"))
    assert msg == (
        "train.optimizer=adamw_sr: stochastic rounding is for bf16 weights, and precision=fp16 trains fp32 ones; "
        "accepted with precision=fp16: auto, adamw, adamw8bit"
    )
    assert error_of(composed("train.optimizer=sgd")).startswith(
        "train.optimizer=sgd: not an accepted value; accepted: auto,"
    )


def test_fp8_settings_are_checked_against_the_schema():
    msg = error_of(composed("precision=fp8", "precision.scaling=tensorwise"), H100)
    assert msg == "precision.scaling=tensorwise: not an accepted value; accepted: delayed, current"


def test_the_fsdp_all_gather_is_one_of_its_three():
    validate(composed("backend.fsdp_all_gather=copy_engine"), H100)
    msg = error_of(composed("backend.fsdp_all_gather=sm"))
    assert msg == "backend.fsdp_all_gather=sm: not an accepted value; accepted: auto, nccl, copy_engine"


def test_a_synthetic_dataset_refuses_a_file_it_would_not_read(tmp_path):
    records = tmp_path / "dolly.jsonl"
    records.write_text('{"instruction": "a", "response": "b"}\n')
    validate(composed("data=dolly_file", f"data.path={records}"), None)
    msg = error_of(composed(f"data.path={records}"))
    assert msg.startswith(f"data.path={records}: data=dolly_synthetic") and "data=dolly_file" in msg


def test_unified_pool_size_needs_rmm():
    validate(composed("memory=unified"), H100)
    msg = error_of(composed("memory=unified", "memory.pool_size_gb=0"), H100)
    assert msg == "memory.pool_size_gb=0: must be a number > 0"
    if importlib.util.find_spec("rmm") is None:
        msg = error_of(composed("memory=unified", "memory.pool_size_gb=20"), H100)
        assert msg.startswith("memory.pool_size_gb=20: sizes RMM's managed pool") and "accepted here: null" in msg
    else:
        validate(composed("memory=unified", "memory.pool_size_gb=20"), H100)
    # In a container the image decides the allocator; this interpreter's packages say nothing about it.
    validate(composed("memory=unified", "memory.pool_size_gb=20", "container.image=img.sif"), H100)


def test_data_prepare_and_tokenizer(tmp_path):
    validate(composed("data.prepare=on_the_fly"), None)  # tiny_llama embeds the bpe tokenizer's 320 ids
    msg = error_of(composed("data.prepare=lazy"))
    assert msg.startswith("data.prepare=lazy:") and "ahead, on_the_fly" in msg
    msg = error_of(composed("data.prepare=on_the_fly", "model.vocab_size=300"))
    assert msg.startswith("model.vocab_size=300:") and "at least 320" in msg and "data.tokenizer=byte" in msg
    validate(composed("data.prepare=on_the_fly", "model.vocab_size=300", "data.tokenizer=byte"), None)
    msg = error_of(composed("backend=nemo", "data.prepare=on_the_fly"), H100)
    assert msg.startswith("data.prepare=on_the_fly: backend=nemo") and "data.prepare=ahead" in msg
    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "num_hidden_layers": 4, "max_position_embeddings": 2048}'
    )
    msg = error_of(composed(f"model.path={tmp_path}", "data.tokenizer=bpe"))
    assert msg.startswith("data.tokenizer=bpe:") and "accepted with model.path: auto" in msg


@pytest.mark.parametrize(
    "override, refused",
    [
        ("+precision.allow_tf32=null", "precision.allow_tf32=None: not an accepted value; accepted: True, False"),
        ("+peft.r=null", "peft.r=None: a LoRA setting, and peft=none trains every weight without LoRA"),
        ("+profile.nsys=null", "profile.nsys=None: not a section of nsys's knobs; accepted: its knobs set one by one"),
        ("+backend.tensor_parallel=null", "backend.tensor_parallel=None: must be an integer >= 1"),
    ],
)
def test_null_set_where_the_option_carries_no_such_knob_is_refused(override, refused):
    # The typed section holds None for the knob either way: only the composed keys tell the two apart.
    options = ("backend=torch", "precision=bf16", "peft=none", "profile=none")
    validate(composed(*options), None)
    assert error_of(composed(*options, override)).startswith(refused)
