"""StepMetricsCallback on a real Lightning training loop (CPU): the torch backend's metrics.jsonl rows;
and the NeMo worker's imports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.nemo, pytest.mark.usefixtures("nemo_llm")]


def test_callback_writes_one_row_per_step_with_the_losses_lightning_saw(tmp_path, capsys):
    import lightning.pytorch as pl

    from ghsweep.train.nemo.metrics import StepMetricsCallback

    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.seen: list[float] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.seen.append(float(loss))
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    callback = StepMetricsCallback(str(tmp_path / "metrics.jsonl"), tokens_per_step=256, max_steps=6, log_every=4)
    module = Regression()
    trainer = pl.Trainer(
        max_steps=6,
        accelerator="cpu",
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, data)

    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(6))
    assert all(set(r) == {"step", "loss", "step_time_ms", "tokens"} for r in rows)
    assert [r["loss"] for r in rows] == pytest.approx(module.seen)
    assert all(r["tokens"] == 256 and r["step_time_ms"] > 0 for r in rows)
    # The loss falls: the rows follow training, not a constant.
    assert rows[-1]["loss"] < rows[0]["loss"]
    out = capsys.readouterr().out
    assert "step 4/6 loss" in out and "step 6/6 loss" in out
    assert callback.params_total == callback.params_trainable == 5
    assert callback.train_ended_at >= callback.train_started_at > 0
    summary = callback.log.summary(min_warmup=2)
    assert summary["steps"] == 6 and summary["steady_steps"] == 4
    assert summary["final_loss"] == pytest.approx(module.seen[-1])


def test_the_nemo_training_path_loads_none_of_the_torch_backend():
    """NeMo's worker shares the light pieces (data, device, flops, summary), not the torch backend's
    model code, which imports transformers and peft."""
    code = (
        "import json, sys, ghsweep.train.nemo.nemo_train; "
        "print(json.dumps(sorted(m for m in sys.modules if m in ('ghsweep.train.model', 'ghsweep.train.torch_train', "
        "'ghsweep.train.torch_backend'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []
