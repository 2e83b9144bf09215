"""A Jupyter kernel's interrupt during a run whose steps execute as native programs (kernels/program.py):
the path the monitor's stop button takes (JupyterLab asks the kernel manager, which sends SIGINT to the
kernel's process group), without the browser. The run stops at a step boundary, resumes there, and ends
with the uninterrupted run's weights. Real ipykernel processes on this machine; about 15 s."""
from __future__ import annotations

import time

import pytest

from renaissance_nb.kernels import native

pytestmark = pytest.mark.skipif(native.lib() is None, reason="no C library: no native program to interrupt")
jupyter_client = pytest.importorskip("jupyter_client")

SETUP = """
import os, time
import numpy as np
os.environ['RNB_PROGRAM'] = '1'
from renaissance_nb import DeepLearningTask, fc, relu, seq
rng = np.random.default_rng(0)
x = rng.standard_normal((4096, 256)).astype(np.float32)
y = (x[:, :8].sum(1) > 0).astype(np.int64)
def make():
    return (DeepLearningTask('k').model(seq(fc(512), relu(), fc(512), relu(), fc(2)))
            .data(train=(x, y), batch_size=16).total_epochs(8).seed(5))
task = make().compile()
"""
RUN = ("def go(event, info):\n"
       "    if event == 'epoch' and info.epoch == 1: print('GO', flush=True)\n"
       "task.run(progress=False, callbacks=[go])")
REPORT = ("rs = task.run_state\n"
          "print('STOPPED', task.result.interrupted, rs.resume_at is not None, rs.torn_at is None,"
          " int(task.read('step')[0]), task.total_steps,"
          " any(n.startswith('CPU step captured as one native program') for n in task.runner.notes))")
RESUME = ("task.run(progress=False)\n"
          "other = make().compile(); other.run(progress=False)\n"
          "a, b = task.state_dict(), other.state_dict()\n"
          "print('SAME', all(np.array_equal(a[k], b[k]) for k in b), task.result.interrupted)")


class Kernel:
    """One ipykernel process, driven through jupyter_client as JupyterLab drives it."""

    def __init__(self) -> None:
        self.km = jupyter_client.KernelManager(kernel_name="python3")
        self.km.start_kernel()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def execute(self, code: str, until: str | None = None, timeout: float = 300) -> str:
        """Run ``code``; its printed text once the kernel is idle again, or as soon as ``until`` is printed."""
        mid, out = self.kc.execute(code), []
        deadline = time.monotonic() + timeout
        while True:
            msg = self.kc.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != mid:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
                if until is not None and until in content["text"]:
                    return "".join(out)
            elif kind == "error":
                raise AssertionError(f"{content['ename']}: {content['evalue']}")
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(out)

    def wait_idle(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while True:
            msg = self.kc.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def test_a_kernel_interrupt_stops_a_native_run_at_a_step_boundary_and_it_resumes() -> None:
    k = Kernel()
    try:
        k.execute(SETUP)
        k.execute(RUN, until="GO")
        time.sleep(0.2)  # some steps into epoch 2 (of 8), inside a native call most of the time
        k.km.interrupt_kernel()
        k.wait_idle()
        words = k.execute(REPORT).split()
        assert words[:4] == ["STOPPED", "True", "True", "True"], words
        assert 0 < int(words[4]) < int(words[5]), words  # stopped early
        assert words[6] == "True", words  # the steps ran as one native program each
        assert k.execute(RESUME).split() == ["SAME", "True", "False"]
    finally:
        k.close()
