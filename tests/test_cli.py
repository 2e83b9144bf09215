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


@pytest.mark.parametrize("flag, value", [("--epochs", "-1"), ("--batch-size", "0"), ("--nproc", "0"), ("--nproc", "-3"),
                                         ("--seed", "-1"), ("--lr", "nan"), ("--lr", "-0.001"), ("--epochs", "x")])
def test_flag_values_are_refused_in_the_command_lines_words(flag: str, value: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """argparse refuses them naming the flag (--nproc 0 trained on one process; the rest said 'total_epochs:
    epochs=-1 ... pass a whole number', the Python API's words)."""
    with pytest.raises(SystemExit) as info:
        main(["train", flag, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: expected a" in err and value in err and "Traceback" not in err


def test_resume_of_an_edited_header_names_the_file(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """The checksum covers the arrays only: a header edited by hand gave KeyError or AttributeError tracebacks."""
    import json

    import numpy as np
    path = tmp_path / "run.npz"
    assert main(["train", "--epochs", "1", "--batch-size", "64", "--checkpoint", str(path)]) == 0
    capsys.readouterr()
    arrays = dict(np.load(path))
    header = json.loads(bytes(arrays["header.json"]).decode())
    for edit, words in ((lambda c: c.pop("config"), "lacks blueprint"),
                        (lambda c: c["config"].update(optimizer="adam"), "setting optimizer differs"),
                        (lambda c: c["config"].update(batch_size=0), "records batch_size = 0")):
        h = json.loads(json.dumps(header))
        edit(h)
        bad = tmp_path / "bad.npz"
        np.savez(bad, **{**arrays, "header.json": np.frombuffer(json.dumps(h).encode(), np.uint8)})
        assert main(["train", "--resume", str(bad)]) == 1
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, err


def test_bad_learning_rates_and_epoch_counts_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--lr", "1e300"]) == 1  # it used to train, overflow to inf and blame the gradients
    err = capsys.readouterr().err
    assert err.startswith("error: AdamW: lr=1e+300 is invalid; expected a finite number in [0.0, 3.4") and "Fix:" in err
    assert main(["train", "--epochs", "100000000"]) == 1  # it used to fail allocating a 24 GiB lr table
    err = capsys.readouterr().err
    assert err.startswith("error: total_epochs: epochs=100000000 is invalid; expected at most") and "Traceback" not in err


def _ctrl_c_at_step_event(monkeypatch: pytest.MonkeyPatch, nth: int) -> None:
    """A real SIGINT at the ``nth`` "step" callback of the next run (they come at steps 16, 32, 48 of an epoch)."""
    import os
    import signal

    from renaissance_nb import DeepLearningTask

    run, seen = DeepLearningTask.run, []

    def run_with_ctrl_c(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        def press(event, payload=None):  # type: ignore[no-untyped-def]
            if event == "step":
                seen.append(event)
                if len(seen) == nth:
                    os.kill(os.getpid(), signal.SIGINT)
        return run(self, *args, callbacks=[press], **kwargs)
    monkeypatch.setattr(DeepLearningTask, "run", run_with_ctrl_c)


def test_checkpoint_keeps_a_run_stopped_by_ctrl_c_and_resume_ends_on_the_same_weights(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """SIGINT at step 16 of epoch 2: exit 130 with the run saved at that step; ``--resume`` then ends on the
    bytes of an uninterrupted run, its best epoch beside it."""
    import numpy as np

    whole, cut = tmp_path / "whole.npz", tmp_path / "cut.npz"
    assert main(["train", "--epochs", "2", "--batch-size", "64", "--checkpoint", str(whole)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^time: [\d.]+ s in all, [\d.]+ s of it in 2 epochs of training$", out, re.M), out
    assert f"saved: the last epoch in {whole}, the best (epoch 2) in {tmp_path / 'whole-best.npz'}" in out
    assert f"python -m renaissance_nb export {tmp_path / 'whole-best.npz'} --onnx model.onnx" in out

    with monkeypatch.context() as m:
        _ctrl_c_at_step_event(m, 4)  # epoch 1 has three, at 16, 32 and 48 of its 63 steps
        assert main(["train", "--epochs", "2", "--batch-size", "64", "--checkpoint", str(cut)]) == 130
    captured = capsys.readouterr()
    assert "interrupted by Ctrl-C after 1 of 2 epochs" in captured.err
    assert f"saved the run at this step in {cut}; continue it with: python -m renaissance_nb train --resume {cut}" \
        in captured.out
    assert np.load(cut)["region_W"].tobytes() != np.load(whole)["region_W"].tobytes()

    assert main(["train", "--resume", str(cut)]) == 0  # its epochs, batch size, rate and seed from the file
    out = capsys.readouterr().out
    assert "resumed from " + str(cut) + ": continuing epoch 2 of 2 after its step 16 of 63" in out, out
    for key in ("region_W", "region_M", "region_V"):
        assert np.load(cut)[key].tobytes() == np.load(whole)[key].tobytes(), key
    assert (tmp_path / "cut-best.npz").is_file()


def test_ctrl_c_without_checkpoint_says_the_progress_is_lost_and_how_to_keep_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _ctrl_c_at_step_event(monkeypatch, 1)
    assert main(["train", "--epochs", "1", "--batch-size", "64"]) == 130
    captured = capsys.readouterr()
    assert "interrupted by Ctrl-C after 0 of 1 epochs" in captured.err
    assert "the progress is lost: nothing was saved. To keep it next time, add --checkpoint run.npz" in captured.out
    assert "then continue with python -m renaissance_nb train --resume run.npz" in captured.out


def test_resume_refuses_a_flag_that_differs_from_the_checkpoint(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "run.npz"
    assert main(["train", "--epochs", "1", "--batch-size", "64", "--checkpoint", str(path)]) == 0
    capsys.readouterr()
    for flag, value, was in (("--seed", "7", "123"), ("--epochs", "3", "1"), ("--batch-size", "32", "64")):
        assert main(["train", "--resume", str(path), flag, value]) == 1
        err = capsys.readouterr().err  # in the command line's words (epochs and batch size named tensor shapes)
        assert err.startswith(f"error: {flag} {value} differs from the {was} the run in") and f"drop {flag}" in err
    assert main(["train", "--resume", str(tmp_path / "none.npz")]) == 1
    assert "no checkpoint file at" in capsys.readouterr().err


def test_the_output_explains_region_letters_padding_and_variants(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--epochs", "1", "--batch-size", "64"]) == 0
    out = capsys.readouterr().out
    assert "arena by region family (one letter each, the start of its regions' names):" in out
    for letter, words in (("W", "weights"), ("G", "gradients"), ("M", "first moments"), ("V", "second moments"),
                          ("I", "input buffers A/B"), ("F", "feature maps and gradient slots"),
                          ("S", "scalars and masks"), ("T", "temporaries"), ("R", "results and metrics")):
        assert re.search(rf"^  {letter} +[\d.]+ (B|KiB|MiB)  {words}$", out, re.M), (letter, out)
    assert ("padding: each row of fc2.weight (1024 floats, a multiple of 4 KiB) is stored as 1040 floats, and so are "
            "its gradient and optimizer moments") in out
    assert "variants collapsed" not in out
    assert ("here train_lowres has train_base's shapes and train_lowres_last has train_last's shapes, so they reuse "
            "those graphs") in out
    assert "the trained model was not saved; add --checkpoint run.npz to keep it" in out
    assert "jupyter lab notebooks/01_tour.ipynb" in out


def test_misspelt_flags_and_commands_name_the_right_one(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, hint in ((["train", "--batchsize", "64"], "(--batchsize: did you mean --batch-size?)"),
                       (["train", "--batch_size=64"], "(--batch_size: did you mean --batch-size?)"),
                       (["train", "--chekpoint", "x"], "(--chekpoint: did you mean --checkpoint?)"),
                       (["trian"], "(did you mean train?)"),
                       (["train", "--device", "cdua"], "(did you mean cuda?)")):
        with pytest.raises(SystemExit) as info:
            main(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.rstrip().endswith(hint), (argv, err)
    with pytest.raises(SystemExit):
        main(["train", "--batchsize", "64"])
    assert "usage: python -m renaissance_nb train" in capsys.readouterr().err  # the subcommand's usage


def test_rank_advice_names_rank_counts_and_batch_sizes_that_work() -> None:
    """4,000 samples on 3 ranks: no batch size splits them (4000 % 3 = 1), and the command line cannot drop
    samples, so the advice is the --nproc values that divide 4,000; a batch that does not split names one that does."""
    from renaissance_nb import DeepLearningTask, datasets
    from renaissance_nb.__main__ import _as_flags, original_mlp
    from renaissance_nb.errors import ConfigError

    def plan_error(ranks: int, batch: int) -> str:
        task = (DeepLearningTask().model(original_mlp()).data(datasets.default_mnist(), batch_size=batch)
                .distributed("mpi", ranks=ranks))
        with pytest.raises(ConfigError) as info:
            task.plan()
        return _as_flags(str(info.value))

    assert plan_error(3, 128).endswith("Fix: --nproc 2, 4, 5 or 8 (rank counts that divide 4000), or --mnist DIR "
                                       "with data whose training samples the ranks divide.")
    advice = plan_error(8, 100)
    batch = int(re.search(r"Fix: --batch-size (\d+) \(a multiple of 8 whose last batch is one too\)", advice)[1])  # type: ignore[index]
    assert batch % 8 == 0 and (4000 % batch) % 8 == 0
    DeepLearningTask().model(original_mlp()).data(datasets.default_mnist(), batch_size=batch).distributed(
        "mpi", ranks=8).plan()  # the advised batch plans
