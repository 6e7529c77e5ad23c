"""The worker summary's compile time: what torch.compile took in this process, read from dynamo's timers."""

from __future__ import annotations

import torch
import torch._dynamo.utils as dynamo_utils

from ghsweep.train.summary_builder import BACKWARD_COMPILE, compile_seconds


def test_compile_seconds_count_each_compile_forward_and_backward_and_no_compiled_call():
    before = compile_seconds() or 0.0
    backward_compiles = len(dynamo_utils.compilation_time_metrics.get(BACKWARD_COMPILE, []))

    # A function of its own: dynamo has not seen its code, so the first call traces it.
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return (torch.sin(x) * 2).cos()

    # aot_eager: AOTAutograd's forward and its lazily compiled backward, without Inductor's time.
    compiled = torch.compile(scaled, backend="aot_eager")
    x = torch.randn(8, requires_grad=True)
    loss = compiled(x).sum()
    after_forward = compile_seconds()
    assert after_forward is not None and after_forward > before
    loss.backward()  # the first backward compiles the backward graph, outside the frame's compile
    after_backward = compile_seconds()
    assert after_backward is not None and after_backward >= after_forward
    assert len(dynamo_utils.compilation_time_metrics[BACKWARD_COMPILE]) == backward_compiles + 1
    for _ in range(3):  # the same shapes: the compiled code runs, nothing is traced or compiled
        compiled(x).sum().backward()
    assert compile_seconds() == after_backward
