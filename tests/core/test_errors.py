"""A failure in one line: the record of a failed run and the benchmark's table show it."""

from __future__ import annotations

import pytest

from ghsweep.core.errors import one_line

pytestmark = pytest.mark.quick


def test_one_line_is_the_type_and_the_first_line():
    assert one_line(ValueError("train.seq_length=3: below 8\nmore detail")) == "ValueError: train.seq_length=3: below 8"
    assert one_line(RuntimeError("")) == "RuntimeError: "


def test_a_wrapping_message_keeps_the_line_that_names_the_cause():
    # torch.compile's BackendCompilerFailed starts "backend='inductor' raised:" and names the cause next.
    wrapped = RuntimeError(
        "backend='inductor' raised:\nRuntimeError: Cannot access data pointer of Tensor\n\nSet TORCHDYNAMO_VERBOSE=1"
    )
    assert one_line(wrapped) == (
        "RuntimeError: backend='inductor' raised: RuntimeError: Cannot access data pointer of Tensor"
    )
