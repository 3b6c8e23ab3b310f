"""A failure inside vLLM reaches the user as one taps-train line: what vLLM said, where its log is, what to do."""

import stat

import pytest

from taps_train.engine.serve import ServedDraft, VllmRequest, run_worker
from taps_train.errors import TapsError


def test_a_failure_inside_vllm_is_one_line_saying_what_to_do(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'INFO loading'\necho '[rank0]: Traceback (most recent call last):'\n"
                    "echo '[rank0]: RuntimeError: Unsupported CPU attention configuration: head_dim=8'\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    request = VllmRequest("v", "float32", [[1, 2]], 4, [0], ServedDraft("d", "eagle", 3))
    with pytest.raises(TapsError) as err:
        run_worker(str(fake), request, "probe", tmp_path / "logs")
    message = str(err.value)
    assert "\n" not in message and "RuntimeError: Unsupported CPU attention configuration: head_dim=8" in message
    assert "[rank0]" not in message and "--engine taps" in message and str(tmp_path / "logs" / "probe.log") in message
