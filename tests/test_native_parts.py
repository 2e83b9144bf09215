"""The C library's parts (kernels/native_build.py): the core is built at import, the GPT's and mixed
precision's kernels on first use, on the core's thread pool; and a float32 job never imports ml_dtypes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import forked_child_exits_0

from renaissance_nb.kernels import gelu_native, native, native_build

needs_lib = pytest.mark.skipif(native.lib() is None, reason="no C library here (no compiler, or RNB_NATIVE=0)")
ROOT = Path(__file__).resolve().parents[1]


def test_every_part_builds_wherever_a_compiler_is_found() -> None:
    """As test_native's check for the core: a part's source that stops compiling fails the suite."""
    if os.environ.get("RNB_NATIVE") == "0" or native.compiler() is None:
        pytest.skip("no C compiler here (or RNB_NATIVE=0): numba's kernels run")
    lib = native.lib()
    assert lib is not None, native.status().why_not
    for part in native_build.PARTS[1:]:
        assert lib.part(part) is not None
        assert lib.parts[part.name].lib is not None and lib.parts[part.name].path.name.startswith("rnb_native_")
    assert {p.name for part in native_build.PARTS for p in part.sources} == {
        p.name for p in native_build.HERE.glob("*.c")}, "every C source is in exactly one part"
    sources = [p for part in native_build.PARTS for p in part.sources]
    assert len(sources) == len(set(sources))


_JOBS = """
import hashlib, json, os, sys
import numpy as np
import renaissance_nb as rnb
rng = np.random.default_rng(0)
x, y = rng.standard_normal((256, 20)).astype(np.float32), rng.integers(0, 5, 256).astype(np.int32)
def run(precision):
    t = (rnb.DeepLearningTask("m").model(rnb.seq(rnb.fc(32), rnb.relu(), rnb.fc(5))).data(train=(x, y), batch_size=32)
         .optimizer(rnb.AdamW()).precision(precision).total_epochs(2).seed(1).compile())
    t.run(progress=False)
    return hashlib.sha256(b"".join(t.read(f"fc{i}.{k}").tobytes() for i in (1, 2) for k in ("weight", "bias"))).hexdigest()
out = {"fp32": run("fp32"), "ml_dtypes_after_fp32": "ml_dtypes" in sys.modules,
       "libs_after_fp32": sorted(os.listdir(os.environ["RNB_CACHE_DIR"]))}
from renaissance_nb.kernels import native
bf16 = run("bf16")
out.update(bf16=bf16, ml_dtypes_after_bf16="ml_dtypes" in sys.modules, note=native.status().describe(),
           bf16_note=native.plan_note({"cast", "fc_fwd_lowp"}),
           libs_after_bf16=sorted(os.listdir(os.environ["RNB_CACHE_DIR"])))
print(json.dumps(out))
"""


def _jobs(cache: Path, extra: dict | None = None) -> dict:
    env = {**os.environ, "RNB_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT), **(extra or {})}
    out = subprocess.run([sys.executable, "-c", _JOBS], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_lib
def test_a_float32_job_builds_the_core_alone_and_a_bf16_one_the_rest(tmp_path: Path) -> None:
    """From an empty cache, in a fresh process: the float32 MLP builds one library and imports no ml_dtypes
    (0.6 s of every start); the bf16 MLP after it builds the gpt_lowp part. A second process loads both from
    the cache and trains to the same bytes."""
    cold = _jobs(tmp_path)
    assert not cold["ml_dtypes_after_fp32"] and cold["ml_dtypes_after_bf16"]
    assert len(cold["libs_after_fp32"]) == 1 and cold["libs_after_fp32"][0].startswith("rnb_native-")
    assert len(cold["libs_after_bf16"]) == 2
    assert any(n.startswith("rnb_native_gpt_lowp-") for n in cold["libs_after_bf16"])
    assert "its gpt_lowp part compiled by" in cold["note"], cold["note"]
    warm = _jobs(tmp_path)
    assert "its gpt_lowp part loaded from the cache" in warm["note"], warm["note"]
    assert warm["libs_after_bf16"] == cold["libs_after_bf16"]
    assert (warm["fp32"], warm["bf16"]) == (cold["fp32"], cold["bf16"]) and cold["fp32"] != cold["bf16"]


@needs_lib
def test_a_part_runs_on_the_core_pool_and_follows_its_fork_flag() -> None:
    """The part's GELU gives the same bytes on the core's pool (2 threads) as on one thread, and in a forked
    child (the core's fork flag, read through part.c's pointer) runs on one thread and returns them too."""
    x = np.linspace(-6, 6, 300_001, dtype=np.float32)
    y, ref = np.empty_like(x), np.empty_like(x)
    kernel = gelu_native.bind_gelu(x, None, y, "tanh", 2)
    assert kernel is not None
    kernel()
    gelu_native.bind_gelu(x, None, ref, "tanh", 1)()
    assert y.tobytes() == ref.tobytes()
    def child() -> bool:  # the threaded call returns the parent's bytes
        z = np.zeros_like(x)
        gelu_native.bind_gelu(x, None, z, "tanh", 2)()
        return z.tobytes() == y.tobytes()
    forked_child_exits_0(child, "the forked child hung in a part's threaded kernel")


@needs_lib
def test_a_part_that_cannot_be_built_says_so(tmp_path: Path) -> None:
    """A compiler that builds the core but fails on a part: looking up one of the part's entries raises an
    OSError naming the part and the compiler's words, with_part gives None (the binders decline), the build's
    line says why, and the core's entries still work; the failure is kept (no second compile)."""
    lib = native.lib()
    fake, calls = tmp_path / "cc", tmp_path / "calls"
    fake.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'cc: fatal error: lowp.c: no space left' >&2\nexit 1\n")
    fake.chmod(0o755)
    core_copy = tmp_path / "cache" / lib.core_path.name  # beside it the part would be built
    core_copy.parent.mkdir()
    core_copy.write_bytes(lib.core_path.read_bytes())
    broken = native_build.Library(lib.core, core_copy, str(fake), native_build.FLAGS)
    counts = []
    for _ in range(2):
        with pytest.raises(OSError, match=r"gpt_lowp part could not be built .*no space left"):
            broken.rnb_gelu
        counts.append(calls.read_text().count("x"))
    assert counts[0] >= 2 and counts[1] == counts[0], counts  # --version and the sources once; no second compile
    assert native.with_part(broken) is None and native.with_part(lib) is lib
    line = native_build.Build(lib=broken, path=core_copy).describe()
    assert "its gpt_lowp part could not be built: OSError" in line and "no space left" in line
    assert broken.rnb_abi() == native_build.ABI
    assert not list(core_copy.parent.glob("rnb_native_gpt_lowp-*"))
    assert not list(core_copy.parent.glob(native.TEMP_PREFIX + "*"))


@needs_lib
def test_a_part_goes_to_this_users_folder_where_the_shared_cache_is_read_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared cache that holds only the core and that this user cannot write: the part is built (once) in
    the user's own folder, and found there next time."""
    lib = native.lib()
    shared, own = tmp_path / "shared", tmp_path / "own"
    shared.mkdir()
    core_copy = shared / lib.core_path.name
    core_copy.write_bytes(lib.core_path.read_bytes())
    monkeypatch.setattr(native_build, "_user_folder", lambda: own)
    writable = os.access
    monkeypatch.setattr(native_build.os, "access", lambda p, mode: Path(p) != shared and writable(p, mode))
    first = native_build.Library(lib.core, core_copy, lib.cc, lib.flags)
    assert first.rnb_gelu is not None and first.parts["gpt_lowp"].compiled
    assert first.parts["gpt_lowp"].path.parent == own and not list(shared.glob("rnb_native_gpt_lowp-*"))
    again = native_build.Library(lib.core, core_copy, lib.cc, lib.flags)
    assert again.has("gpt_lowp") and not again.parts["gpt_lowp"].compiled
    assert again.parts["gpt_lowp"].path == first.parts["gpt_lowp"].path


_CORE_ONLY_CC = """#!/bin/sh
for a in "$@"; do case "$a" in *lowp.c) echo "cc: lowp.c: internal compiler error" >&2; exit 1;; esac; done
exec {cc} "$@"
"""


@needs_lib
def test_a_plan_runs_on_numba_where_the_part_cannot_be_built(tmp_path: Path) -> None:
    """With a compiler that fails on lowp.c only: an fp32 MLP binds C (the core), a bf16 one binds numba for the
    whole plan (one thread pool) and says why, and trains to the same bytes as with the part (test above)."""
    fake = tmp_path / "cc"
    fake.write_text(_CORE_ONLY_CC.format(cc=native.compiler()))
    fake.chmod(0o755)
    env = {"CC": str(fake), "RNB_CACHE_DIR": str(tmp_path / "cache")}
    broken, whole = _jobs(tmp_path / "cache", env), _jobs(tmp_path / "whole")
    assert "its gpt_lowp part could not be built" in broken["note"] and "internal compiler error" in broken["note"]
    assert broken["bf16_note"].startswith("fused passes in numba: OSError"), broken["bf16_note"]
    assert whole["bf16_note"].startswith("fused passes in C"), whole["bf16_note"]
    assert (broken["fp32"], broken["bf16"]) == (whole["fp32"], whole["bf16"])


@needs_lib
def test_a_child_forked_while_a_part_builds_does_not_wait_for_it() -> None:
    """The parent's lock is held (a thread mid-build) when it forks: the child gets a lock of its own."""
    lib = native.lib()
    with lib._lock:
        forked_child_exits_0(lambda: lib.has("gpt_lowp"), "the forked child waited for its parent's lock")


_RACE = """
import sys, threading
import numpy as np
from renaissance_nb.memory.dtensor import register_dtype
assert "ml_dtypes" not in sys.modules
first = threading.Thread(target=register_dtype, args=("bfloat16",))
first.start()
while "ml_dtypes" not in sys.modules:  # the first thread's import has begun (it takes about 0.5 s)
    pass
register_dtype("bfloat16")
print(np.dtype("bfloat16").itemsize)
"""


def test_a_second_thread_registering_bfloat16_waits_for_the_first() -> None:
    out = subprocess.run([sys.executable, "-c", _RACE], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and out.stdout.split() == ["2"], out.stderr[-1500:]
