"""Helpers shared by several test modules: finite differences, a local file server, a forked child's exit."""
from __future__ import annotations

import contextlib
import functools
import http.server
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np


def numgrad(f: Callable[[], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar f() with respect to x (x is perturbed in place)."""
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * eps)
    return g


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
        pass


@contextlib.contextmanager
def serve_directory(folder: Path) -> Iterator[str]:
    """Serve a folder over HTTP on 127.0.0.1 (an ephemeral port) while the block runs; yields its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def one_step_gradients(task) -> None:  # type: ignore[no-untyped-def]
    """Run batch 0's forward and backward (no optimizer) through a compiled task's bound graphs."""
    from renaissance_nb import GraphId

    ex = task.executor
    ex.view("train_base", "cursor")[0] = 0
    for gid in (GraphId.CLEAR_METRICS, GraphId.TRANSFER_A, GraphId.FIRST_LAYER_FWD_A, GraphId.DEEP_FWD_BWD,
                GraphId.FIRST_LAYER_BWD_A):
        for k in ex.kernels("train_base", gid):
            k()


def train_in_processes(tmp_path: Path, script: str, envs: dict[str, dict[str, str]]) -> dict[str, dict]:
    """Run ``script`` (it saves its results to the .npz path it is given) once per entry of
    ``envs``, each in a fresh Python with those environment variables added; name -> its arrays."""
    import os
    import subprocess
    import sys
    path = tmp_path / "train.py"
    path.write_text(script)
    runs = {}
    for name, env in envs.items():
        out = tmp_path / f"{name}.npz"
        subprocess.run([sys.executable, str(path), str(out)], check=True, env={**os.environ, **env}, timeout=300)
        runs[name] = dict(np.load(out))
    return runs


def torch_sgd_steps(model, x: np.ndarray, y: np.ndarray, *, batch: int, lr: float,  # type: ignore[no-untyped-def]
                    momentum: float = 0.9) -> None:
    """The reference side of a parity run: ``model`` trained on x, y in order, one SGD-with-momentum step
    of cross entropy per batch of ``batch`` (the engine's shuffle=False epoch), in training mode."""
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model.train()
    for i in range(len(x) // batch):
        xb = torch.from_numpy(np.ascontiguousarray(x[batch * i:batch * (i + 1)]))
        yb = torch.from_numpy(np.asarray(y[batch * i:batch * (i + 1)], dtype=np.int64))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()


def copy_into_torch(pairs, state: dict) -> None:  # type: ignore[no-untyped-def]
    """Load the engine's ``state`` (``task.state_dict()``) into torch modules named as the compiler
    names them: ``pairs`` is [(our layer name, torch module)]."""
    import torch
    with torch.no_grad():
        for name, mod in pairs:
            for role, t in mod.state_dict().items():
                if role != "num_batches_tracked":
                    t.copy_(torch.from_numpy(state[f"{name}.{role}"]).reshape(t.shape))


def image_blobs(n: int, seed: int = 0, classes: int = 4, scale: float = 1.0,
                shift: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    """n 3x8x8 images of N(0, scale) whose first channel is shifted by class * shift: separable, small,
    deterministic."""
    r = np.random.default_rng(seed)
    y = r.integers(0, classes, n)
    x = (r.normal(size=(n, 3, 8, 8)) * scale).astype(np.float32)
    x[:, 0] += (y * shift)[:, None, None].astype(np.float32)
    return x, y


def train_from_torch(model, x: np.ndarray, y: np.ndarray, *, lr: float, batch: int = 16):  # type: ignore[no-untyped-def]
    """Both sides of a from_torch parity run: the engine trains ``model``'s BluePrint from its weights for
    one shuffle-free epoch of SGD with momentum, then torch trains ``model`` on the same batches.
    Returns (the trained task, the state dict from_torch gave: the engine's names in the module's order)."""
    from renaissance_nb import SGD, BluePrint, DeepLearningTask
    blueprint, state = BluePrint.from_torch(model, weights=True)
    task = (DeepLearningTask().model(blueprint).data(train=(x, y), batch_size=batch, shuffle=False)
            .optimizer(SGD().lr(lr).momentum(0.9)).total_epochs(1).seed(0))
    task.compile()
    task.load_state_dict(state)
    task.run(progress=False)
    torch_sgd_steps(model, x, y, batch=batch, lr=lr)
    return task, state


def thirty_steps_against_torch(blueprint, net, pairs, *, floor: float = 1e-12,  # type: ignore[no-untyped-def]
                               steps: int = 30, batch: int = 16, lr: float = 0.02) -> float:
    """A block net's parity run: the engine's initial weights copied into ``net`` (``pairs``: our layer
    name -> torch module), ``steps`` SGD-with-momentum steps on both sides with batch norm in training
    mode, and every final parameter and running statistic compared (relative Frobenius, against
    max(its norm, ``floor``)) to 1e-4 (test_torch_parity's bound on final weights is 1e-3). Returns the
    worst difference."""
    from renaissance_nb import SGD, DeepLearningTask
    x, y = image_blobs(steps * batch)
    task = (DeepLearningTask().model(blueprint).data(train=(x, y), batch_size=batch, shuffle=False)
            .optimizer(SGD().lr(lr).momentum(0.9)).total_epochs(1).seed(5).options(prefetch=False))
    task.compile()
    copy_into_torch(pairs, task.state_dict())
    task.run(progress=False)
    torch_sgd_steps(net, x, y, batch=batch, lr=lr)
    ours, worst = task.state_dict(), 0.0
    for name, mod in pairs:
        for role, t in mod.state_dict().items():
            if role == "num_batches_tracked":
                continue
            want = t.detach().numpy()
            got = ours[f"{name}.{role}"].reshape(want.shape)
            rel = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), floor))
            assert rel < 1e-4, (name, role, rel)
            worst = max(worst, rel)
    return worst


def forked_child_exits_0(child: Callable[[], bool], hang: str) -> None:
    """Fork; the child exits 0 where ``child()`` is true (3 where not, killed by an alarm after 20 s); the parent
    fails the test with ``hang`` where the child has not ended within 30 s, or with the child's status."""
    import pytest
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)
        os._exit(0 if child() else 3)
    for _ in range(300):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail(hang)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
