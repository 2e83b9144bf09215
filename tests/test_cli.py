"""The main job, ``python -m renaissance_nb train``: phases, plan and metrics printed; clear errors."""
from __future__ import annotations

import re

import pytest

from renaissance_nb.__main__ import main
from renaissance_nb.gpu import probe


def test_train_prints_phases_plan_and_learns(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--epochs", "2", "--batch-size", "64"]) == 0
    out = capsys.readouterr().out
    for phase in ("plan()", "PLANNING", "lock_memory()", "MEMORY_LOCKED", "compile()", "COMPILED", "device cpu"):
        assert phase in out
    tops = [float(t) for t in re.findall(r"val loss [\d.]+ +top1 +([\d.]+)%", out)]
    assert len(tops) == 2 and tops[-1] > 80.0, out  # real MNIST digits: well above chance after 2 epochs


@pytest.mark.skipif(probe()[0] is not None, reason="a GPU is present")
def test_cuda_without_a_gpu_is_an_error_line_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--epochs", "1", "--device", "cuda"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: device('cuda'):") and "Fix:" in err and "Traceback" not in err


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "train" in capsys.readouterr().out


def test_a_missing_mnist_folder_says_the_flag_to_add(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    assert main(["train", "--mnist", str(tmp_path / "none"), "--epochs", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: mnist: root=") and "add --download" in err and "download=True" not in err
