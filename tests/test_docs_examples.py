"""Every code block of README.md and docs/*.md runs as written.

A block's language says what it is: ``python`` blocks run, each in a fresh namespace, in a temporary
folder with a temporary home (``~/data/...`` lands there); ``bash`` blocks install packages, start a
server or run this suite, so each carries ``<!-- docs-test: skip: REASON -->`` on the line before it
(the extras their pip commands name are checked against pyproject.toml instead); ``text`` (printed
output, a file tree) and ``mermaid`` (a diagram) are not code. A download is served from 127.0.0.1:
``datasets.mnist`` and ``datasets.cifar10`` run their real download and checks against small fake
files there. A block that imports torch or onnx skips where they are not installed. A block marked
``<!-- docs-test: continues the block above -->`` is a notebook's next cell: the blocks before it run first.
"""
from __future__ import annotations

import hashlib
import gzip
import re
import tomllib
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Iterator

import pytest
from helpers import serve_directory
from test_cifar import fake_cifar, make_archive
from test_mnist import fake_mnist, idx_bytes

from renaissance_nb import datasets
from renaissance_nb.data.cifar import CIFAR10_ARCHIVE
from renaissance_nb.kernels.native_build import cache_dir

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
SKIP = re.compile(r"<!-- docs-test: skip: (.+?) -->\s*$")
CONTINUES = "<!-- docs-test: continues the block above -->"
"""Marks a block that is the next cell of a notebook: it runs after the block before it, in its namespace."""
RUNS, SKIPPED_ONLY, NOT_CODE = {"python"}, {"bash"}, {"text", "mermaid"}
OPTIONAL = ("torch", "onnx", "onnxruntime", "safetensors")
"""Packages of extras ([export], torch) a block may need: it skips without them, saying which."""


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    lang: str
    code: str
    skip: str | None
    after: str = ""  # the code of the blocks it continues, run first
    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks() -> list[Block]:
    out = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            reason = SKIP.search(before)
            after = out[-1].after + out[-1].code if before.strip() == CONTINUES and out else ""
            out.append(Block(path.relative_to(ROOT).as_posix(), text.count("\n", 0, m.start()) + 1, m[1], m[2],
                             reason[1] if reason else None, after))
    return out


BLOCKS = blocks()


def test_every_block_says_what_it_is_and_every_shell_block_why_it_does_not_run() -> None:
    assert len(BLOCKS) >= 10  # README and the guide have that many at least
    unlabelled = [str(b) for b in BLOCKS if b.lang not in RUNS | SKIPPED_ONLY | NOT_CODE]
    assert not unlabelled, f"blocks without a known language (python, bash, text, mermaid): {unlabelled}"
    unexplained = [str(b) for b in BLOCKS if b.lang in SKIPPED_ONLY and not b.skip]
    assert not unexplained, f"bash blocks without a docs-test skip reason: {unexplained}"


def test_the_extras_the_docs_install_exist() -> None:
    """``pip install '.[notebook]'`` and the like cannot run here; the extras they name must exist, and the
    notebook extra must bring the ``jupyter lab`` the README then starts."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = {e for b in BLOCKS if "pip install" in b.code for group in re.findall(r"\[([\w,-]+)\]", b.code)
             for e in group.split(",")}
    assert named and named <= set(extras), named - set(extras)
    assert any(d.startswith("jupyterlab") for d in extras["notebook"])


@pytest.fixture
def served_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``datasets.mnist`` and ``datasets.cifar10`` pointed at small fake files on 127.0.0.1 (the real download
    and its checksum run), HOME and the working folder temporary."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("RNB_CACHE_DIR", str(cache_dir()))  # the built C passes stay where they are, not in HOME
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    work, server = tmp_path / "work", tmp_path / "server"
    work.mkdir()
    server.mkdir()
    monkeypatch.chdir(work)
    sums = {}
    for name, arr in fake_mnist(n_train=600, n_test=100).items():
        raw = idx_bytes(arr)
        sums[name] = hashlib.sha256(raw).hexdigest()
        (server / f"{name}.gz").write_bytes(gzip.compress(raw))
    sha = hashlib.sha256(make_archive(server / CIFAR10_ARCHIVE, fake_cifar(per_file=40))).hexdigest()
    with serve_directory(server) as url:
        monkeypatch.setattr(datasets, "mnist", partial(datasets.mnist, base_url=url, checksums=sums))
        monkeypatch.setattr(datasets, "cifar10", partial(datasets.cifar10, base_url=url, sha256=sha))
        yield


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang in RUNS], ids=str)
def test_the_block_runs_as_written(block: Block, served_data: None) -> None:
    if block.skip:
        pytest.skip(block.skip)
    for name in OPTIONAL:
        if re.search(rf"^\s*(import|from) {name}\b", block.code, re.M) or (name == "onnx" and "export_onnx" in block.code):
            pytest.importorskip(name, reason=f"{block} needs {name}")
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    if block.after:
        exec(compile(block.after, f"{block} (the blocks it continues)", "exec"), namespace)  # noqa: S102
    exec(compile(block.code, str(block), "exec"), namespace)  # noqa: S102 - the docs' own code
