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
    assert re.search(r"^ {15}device: CPU, .*fused passes in ", out, re.M), out  # the runner's note, under compile()
    tops = [float(t) for t in re.findall(r"val loss [\d.]+ +top1 +([\d.]+)%", out)]
    assert len(tops) == 2 and tops[-1] > 80.0, out  # real MNIST digits: well above chance after 2 epochs


@pytest.mark.skipif(probe()[0] is not None, reason="a GPU is present")
def test_cuda_without_a_gpu_is_an_error_line_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--epochs", "1", "--device", "cuda"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: device('cuda'):") and "Fix:" in err and "Traceback" not in err
    assert "--device cpu / --device auto" in err and "device('cpu')" not in err  # the CLI's own flags


def test_a_failed_download_names_no_flag_the_cli_lacks(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from renaissance_nb.__main__ import _as_flags
    assert _as_flags("... Fix: check the network or base_url, or copy ...") == "... Fix: check the network, or copy ..."


def test_a_missing_mnist_folder_says_the_flag_to_add(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    assert main(["train", "--mnist", str(tmp_path / "none"), "--epochs", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: mnist: root=") and "add --download" in err and "download=True" not in err


def test_version_and_usage_errors_go_where_shells_expect(capsys: pytest.CaptureFixture[str]) -> None:
    from renaissance_nb import __version__

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip().endswith(__version__)
    assert main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "name a command; 'train' is the main job" in captured.err
    with pytest.raises(SystemExit) as info:
        main(["train", "--download"])  # it used to train on the embedded digits, ignoring the flag
    assert info.value.code == 2 and "--download needs --mnist DIR" in capsys.readouterr().err


def test_ctrl_c_during_training_says_so_and_exits_130(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A real SIGINT at step 16: the run stops at a step boundary; the CLI used to print a
    'best epoch -1' line and exit 0 as if training had finished."""
    import os
    import signal

    from renaissance_nb import DeepLearningTask

    run = DeepLearningTask.run

    def run_with_ctrl_c(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        def press(event, payload=None):  # type: ignore[no-untyped-def]
            if event == "step":
                os.kill(os.getpid(), signal.SIGINT)
        return run(self, *args, callbacks=[press], **kwargs)
    monkeypatch.setattr(DeepLearningTask, "run", run_with_ctrl_c)
    assert main(["train", "--epochs", "2", "--batch-size", "64"]) == 130  # "step" comes every 16 steps
    captured = capsys.readouterr()
    assert "interrupted by Ctrl-C after 0 of 2 epochs" in captured.err
    assert "best val" not in captured.out and "epoch -1" not in captured.out


def test_bad_learning_rates_and_epoch_counts_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--lr", "1e300"]) == 1  # it used to train, overflow to inf and blame the gradients
    err = capsys.readouterr().err
    assert err.startswith("error: AdamW: lr=1e+300 is invalid; expected a finite number in [0.0, 3.4") and "Fix:" in err
    assert main(["train", "--epochs", "100000000"]) == 1  # it used to fail allocating a 24 GiB lr table
    err = capsys.readouterr().err
    assert err.startswith("error: total_epochs: epochs=100000000 is invalid; expected at most") and "Traceback" not in err
