"""Generation with the planned decode step: its logits against the full forward, byte-identical text
for a seed, a KV cache in its own MemoryPlan, nothing allocated per token, and the errors."""
from __future__ import annotations

import numpy as np
import pytest

from renaissance_nb import AdamW, DeepLearningTask, gpt
from renaissance_nb.errors import ConfigError
from renaissance_nb.inspector.allocations import enable_nrt_stats, nrt_counts
from tests.gpt_helpers import token_splits

VOCAB, T = 11, 16


@pytest.fixture(scope="module")
def trained():  # type: ignore[no-untyped-def]
    splits = token_splits(200, T, VOCAB, val=40)
    task = (DeepLearningTask().model(gpt(VOCAB, 32, 2, 4, T)).data(splits, batch_size=20)
            .optimizer(AdamW(lr=3e-3)).total_epochs(3).seed(0))
    task.run(progress=False)
    return task, splits


def test_decode_step_gives_the_full_forwards_logits(trained) -> None:  # type: ignore[no-untyped-def]
    task, splits = trained
    x = splits.val.x[:2]
    full = task.predict_logits(x)
    assert full.shape == (2, T, VOCAB)
    step = task.decoder
    for row in range(2):
        step.reset()
        for p in range(T):
            np.testing.assert_allclose(step.run(int(x[row, p]), p), full[row, p], atol=2e-6)


def test_evaluate_reports_per_token_loss_and_perplexity(trained) -> None:  # type: ignore[no-untyped-def]
    task, splits = trained
    m = task.evaluate(splits.val.x, splits.val.y)
    logits = task.predict_logits(splits.val.x).astype(np.float64)
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, splits.val.y[..., None].astype(np.int64), -1).mean()
    assert m["loss"] == pytest.approx(nll, rel=1e-5)
    assert m["perplexity"] == pytest.approx(np.exp(nll), rel=1e-5)
    assert m["top1"] == pytest.approx((logits.argmax(-1) == splits.val.y).mean(), abs=1e-6)
    assert task.result.history[-1].val_loss == pytest.approx(nll, rel=1e-4)  # the epoch's val pass agrees


def test_generation_is_byte_identical_for_a_seed_and_learnt_the_rule(trained) -> None:  # type: ignore[no-untyped-def]
    task, _ = trained
    a = task.generate([1, 4], 12, seed=7)
    b = task.generate([1, 4], 12, seed=7)
    assert a.tobytes() == b.tobytes() and len(a) == 14
    assert not np.array_equal(a, task.generate([1, 4], 12, seed=8))  # another seed, another draw
    greedy = task.generate([1], 10, temperature=0)
    assert list(greedy) == [1, 4, 2, 7, 0, 1, 4, 2, 7, 0, 1]  # next = 3 cur + 1 (mod 11), learnt
    top1 = task.generate([1], 10, top_k=1, seed=3)
    assert list(top1) == list(greedy)  # top_k=1 is greedy whatever the draw


def test_generation_past_the_context_slides_the_window(trained) -> None:  # type: ignore[no-untyped-def]
    """40 tokens from a model of context 16: the cache is refilled with the last half of the text each time it
    is full, so the logits after a refill are the full forward's of that window."""
    task, _ = trained
    out = task.generate([1, 4], 40, temperature=0)
    assert len(out) == 42 and list(out[:12]) == [1, 4, 2, 7, 0, 1, 4, 2, 7, 0, 1, 4]
    assert all((3 * a + 1) % VOCAB == b for a, b in zip(out[:-1], out[1:]))  # the rule holds past the context
    np.testing.assert_array_equal(out, task.generate([1, 4], 40, temperature=0))
    long = task.generate(list(range(11)) * 3, 2, temperature=0)  # a 33-token prompt: its last 16 are read
    assert list(long[:33]) == list(range(11)) * 3 and long[33] == (3 * 10 + 1) % VOCAB


def test_the_kv_cache_is_planned_and_the_step_allocates_nothing(trained) -> None:  # type: ignore[no-untyped-def]
    import tracemalloc
    task, _ = trained
    step = task.decoder
    caches = [t for t in step.plan if t.name.endswith("_cache")]
    assert [t.name for t in caches] == ["attention1.k_cache", "attention1.v_cache", "attention2.k_cache",
                                        "attention2.v_cache"]
    assert all(t.shape == (1, 4, T, 8) for t in caches)
    assert step.cache_bytes == 4 * 4 * T * 8 * 4 == step.by_kind()["KV cache"]
    assert sum(step.by_kind().values()) == sum(t.storage_bytes for t in step.plan)
    def tokens() -> None:
        step.reset()
        for p in range(T):
            step.run(p % VOCAB, p)

    def traced(work) -> int:  # type: ignore[no-untyped-def]
        before = tracemalloc.get_traced_memory()[0]
        work()
        return tracemalloc.get_traced_memory()[0] - before
    tokens()  # warm: every kernel compiled or loaded, every cache filled
    enable_nrt_stats()
    tracemalloc.start()
    try:
        a0 = nrt_counts()
        grown = traced(tokens) - traced(lambda: None)  # less the measurement's own integers
        a1 = nrt_counts()
    finally:
        tracemalloc.stop()
    assert grown <= 0, grown  # nothing kept: every buffer is the decode arena's
    assert a1[0] - a0[0] == a1[1] - a0[1]  # numba's call records, all freed in the call


def test_generate_refuses_bad_requests(trained) -> None:  # type: ignore[no-untyped-def]
    task, _ = trained
    with pytest.raises(ConfigError, match=r"\[0, 11\)"):
        task.generate([11], 2)
    with pytest.raises(ConfigError, match="temperature"):
        task.generate([1], 2, temperature=-1)
    with pytest.raises(ConfigError, match="tokenizer"):
        task.generate("hello", 2)  # toy data: no tokenizer
    with pytest.raises(ConfigError, match="top_k"):
        task.generate([1], 2, top_k=0)
    before = task.generate([1, 2], 4, seed=3)
    for bad in (None, [1.5, 2.7], [[1, 2], [3, 4]], [True, False], b"ab", ["a"], [10 ** 30], [1, [2]]):
        with pytest.raises(ConfigError, match=r"prompt=.* is invalid; expected text, or token ids as a 1-D"):
            task.generate(bad, 2)  # a float id was cut, a batch flattened, the rest raw NumPy/Python errors
    assert task.generate(np.array([1, 2], np.uint8), 4, seed=3).tolist() == before.tolist()  # any int dtype
    one = task.generate([5], 3, seed=1).tolist()
    assert task.generate(5, 3, seed=1).tolist() == task.generate(np.int64(5), 3, seed=1).tolist() == one  # one id
    assert task.generate(np.array([[1, 2]]), 4, seed=3).tolist() == before.tolist()  # one window, as data.x[:1]


def test_a_conv_net_has_no_decode_step() -> None:
    from renaissance_nb import conv, fc, flatten, relu, seq
    from renaissance_nb.errors import ShapeError
    from tests.helpers import image_blobs
    x, y = image_blobs(32)
    task = (DeepLearningTask().model(seq(conv(4, 3, p=1), relu(), flatten(), fc(4))).data(train=(x, y), batch_size=8)
            .total_epochs(1))
    task.compile()
    with pytest.raises(ShapeError, match="conv1 .conv. has no one-token decode step"):
        task.decoder
    with pytest.raises(ConfigError, match="generate: writes text with a language model trained on token windows"):
        task.generate([1], 2)  # said before any decode step is planned (an fc-only model failed on shapes)


def test_onnx_export_runs_in_onnxruntime_with_the_tasks_logits(trained, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    task, splits = trained
    path = task.export_onnx(str(tmp_path / "gpt.onnx"))
    x = splits.val.x[:5]
    got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(
        None, {"input": x.astype(np.int64)})[0]
    want = task.predict_logits(x)
    assert got.shape == want.shape == (5, T, VOCAB)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_the_export_command_reads_a_language_models_checkpoint(trained, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``python -m renaissance_nb export`` rebuilds the task on stand-in token windows (it built float samples
    with one label each, and planning refused every GPT checkpoint); its ONNX gives the task's logits."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from renaissance_nb.__main__ import main
    task, splits = trained
    ckpt = task.save(str(tmp_path / "gpt.npz"))
    onnx_path = str(tmp_path / "gpt.onnx")
    assert main(["export", ckpt, "--onnx", onnx_path]) == 0
    x = splits.val.x[:3]
    got = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"]).run(None, {"input": x.astype(np.int64)})[0]
    want = task.predict_logits(x)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
