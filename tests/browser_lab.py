"""JupyterLab + headless Chromium for the real-browser tests, shared by every tests/test_browser*.py.

One JupyterLab server (127.0.0.1, no token) per test session over a temporary folder holding a copy of
notebooks/01_tour.ipynb; tests open their own notebooks through its contents API (`open_notebook`) and
run cells with JupyterLab's own commands (`run_cell`). Screenshots go to artifacts/screenshots/.

A module that uses these fixtures calls `skip_without_browser()` at import: it skips when Chromium or
Playwright is missing, unless RNB_REQUIRE_BROWSER is set (CI), where a missing browser fails.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHOTS = Path(os.environ.get("RNB_SCREENSHOTS", ROOT / "artifacts" / "screenshots"))
CHROMIUM = os.environ.get("RNB_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"Chromium not found at {CHROMIUM}"
    for mod in ("playwright", "jupyterlab"):
        try:
            __import__(mod)
        except ImportError:
            return f"the Python package {mod} is not installed"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def lab(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A JupyterLab server over a temporary copy of the notebooks (the repo's files stay untouched)."""
    work = tmp_path_factory.mktemp("lab")
    shutil.copy(ROOT / "notebooks" / "01_tour.ipynb", work / "01_tour.ipynb")
    for d in ("config", "data", "runtime", "workspaces", "settings"):
        (work / f".{d}").mkdir()
    notes = work / ".settings" / "@jupyterlab" / "apputils-extension"
    notes.mkdir(parents=True)  # no "official Jupyter news?" toast over the screenshots
    (notes / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(JUPYTER_CONFIG_DIR=str(work / ".config"), JUPYTER_RUNTIME_DIR=str(work / ".runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(work / ".workspaces"), JUPYTERLAB_SETTINGS_DIR=str(work / ".settings"))
    log = open(work / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         "--ServerApp.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
         f"--ServerApp.root_dir={work}", "--expose-app-in-browser", "--LabApp.news_url=None",
         "--JupyterNotebookApp.expose_app_in_browser=True",  # Notebook 7 (/notebooks/...) too
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                log.flush()
                raise RuntimeError("JupyterLab did not start:\n" + (work / "lab.log").read_text()[-3000:])
            time.sleep(0.5)
        yield url
    finally:
        if proc.poll() is None:  # the server and the kernels it started (one process group, ours)
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="session")
def browser_context(lab):  # type: ignore[no-untyped-def]
    """Headless Chromium, one context for every tab of the session."""
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield browser.new_context(viewport={"width": 1280, "height": 2000}, device_scale_factor=1)
        browser.close()


def standalone(page, cls: str):  # type: ignore[no-untyped-def]
    """The first widget of a class displayed on its own (not inside a dashboard)."""
    return page.locator(f".{cls}:not(.rnb-dashboard .{cls})").first


def shot(locator, name: str) -> None:  # type: ignore[no-untyped-def]
    locator.scroll_into_view_if_needed()
    locator.screenshot(path=str(SHOTS / name))


def skip_without_browser() -> Any:
    """The module mark for browser tests: skip (or, under RNB_REQUIRE_BROWSER, fail) when the browser is missing."""
    why = missing()
    if why is None:
        return []
    if os.environ.get("RNB_REQUIRE_BROWSER"):
        pytest.fail(f"RNB_REQUIRE_BROWSER is set but {why}; run scripts/install_browser.sh", pytrace=False)
    return pytest.mark.skip(reason=f"{why} (run scripts/install_browser.sh; set RNB_REQUIRE_BROWSER=1 "
                                   "to make this a failure)")


def open_notebook(context, lab: str, name: str, cells: list[str], front: str = "lab"):  # type: ignore[no-untyped-def]
    """A notebook written through the server's contents API, opened in a new tab of the same browser, in
    JupyterLab (``front="lab"``) or Notebook 7 (``front="notebook"``)."""
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                           "language": "python"}},
          "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": src, "outputs": [],
                     "execution_count": None} for i, src in enumerate(cells)]}
    req = urllib.request.Request(f"{lab}/api/contents/{name}", method="PUT", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"type": "notebook", "format": "json", "content": nb}).encode())
    urllib.request.urlopen(req, timeout=10).close()
    pg = context.new_page()
    # a workspace of its own, reset: only this notebook open (a shared one restores every earlier tab,
    # whose cells the page-wide locators would also find)
    url = f"{lab}/lab/workspaces/{Path(name).stem}/tree/{name}?reset" if front == "lab" else f"{lab}/notebooks/{name}"
    pg.goto(url, wait_until="domcontentloaded", timeout=90_000)
    pg.wait_for_function(f"window.jupyterapp && window.jupyterapp.shell.currentWidget && "
                         f"window.jupyterapp.shell.currentWidget.title.label === '{name}' && "
                         f"{KERNEL} && {KERNEL}.status === 'idle'", timeout=120_000)
    return pg


KERNEL = "window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel"


def run_cell(pg, index: int, wait: bool = True) -> str:  # type: ignore[no-untyped-def]
    """Run cell ``index`` with JupyterLab's command; when ``wait``, its text output once the kernel is idle."""
    pg.evaluate(f"() => {{ const nb = window.jupyterapp.shell.currentWidget.content; nb.activeCellIndex = {index};"
                " window.jupyterapp.commands.execute('notebook:run-cell'); }")
    if not wait:
        return ""
    pg.wait_for_function(f"() => {{ const c = window.jupyterapp.shell.currentWidget.content.model.cells.get({index});"
                         f" return c.executionCount != null && {KERNEL}.status === 'idle'; }}", timeout=240_000)
    return pg.locator(".jp-Cell").nth(index).locator(".jp-OutputArea").inner_text()
