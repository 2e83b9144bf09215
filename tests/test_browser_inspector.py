"""A real browser drives MemoryInspectorView: the step scrubber (keys and slider), a what-if toggle and the
optimizer menu, the largest batch that fits, and the tensor inspector; every number read from the page is
compared with what MemoryInspector (and task.read) compute in the same kernel, printed by the notebook.

The notebook: the seed MLP compiled and trained one short epoch (10 steps), then the widget; a last cell
trains the second epoch in code, which the widget picks up by itself. Screenshots
30_inspector_scrubber.png, 31_inspector_whatif.png and 32_inspector_tensor.png go to SHOTS.
"""
from __future__ import annotations

import json

import pytest

from browser_lab import open_notebook, run_cell, shot, skip_without_browser

pytestmark = skip_without_browser()

SETUP = """
import json
import numpy as np
from renaissance_nb import AdamW, DeepLearningTask, fc, relu, seq
from renaissance_nb.display import MemoryInspectorView

rng = np.random.default_rng(0)
data = rng.standard_normal((1280, 784)).astype(np.float32), rng.integers(0, 10, 1280)
task = (DeepLearningTask("seed").model(seq(fc(1024), relu(), fc(512), relu(), fc(256), relu(), fc(10)))
        .data(train=data, batch_size=128).optimizer(AdamW()).total_epochs(2).seed(0))
task.run(1, progress=False)  # one epoch of two: 10 steps; the second is run later, while the widget shows
insp = task.memory_inspector
budget = 20 << 20
facts = {
    "ticks": [[k.time, k.node.op, k.node.layer, k.gid.name] for k in insp.ticks()],
    "curve": [int(x) for x in insp.live_bytes("train_base")],
    "peak": {v: [insp.peak(v).peak_bytes, insp.peak(v).time] for v in insp.variants},
    "no_reuse": [insp.what_if(liveness=False).arena_bytes, insp.diff(insp.what_if(liveness=False)).summary()],
    "no_reuse_sgd": [insp.what_if(liveness=False, optimizer="sgd").arena_bytes,
                     insp.diff(insp.what_if(liveness=False, optimizer="sgd")).summary()],
    "fit": insp.what_if(liveness=False, optimizer="sgd").fit(budget),
    "arena": insp.arena_bytes,
}
print(json.dumps(facts))
for name in ("fc1.weight", "fc2.weight"):
    x = task.read(name)
    print(f"VALUES {name} {float(x.min())!r} {float(x.max())!r}")
from renaissance_nb.inspector import tensor_stats
u, c = tensor_stats(task, "fc1.weight").update, tensor_stats(task, "cursor").values
print("STATS " + json.dumps({"update": u.as_dict(), "cursor": [c.edges[0], c.edges[-1], c.min, c.max]}))
"""
SHOW = "w = MemoryInspectorView(task)\nw"
STATE = ("print(json.dumps({'tick': w.tick, 'variant': w.variant, 'what_if': w.what_if, 'selected': w.selected, "
         "'fit_budget': w.fit_budget}))")
MORE = """task.run(1, progress=False)  # the second epoch: the widget sees it at its next poll
x = task.read("fc1.weight")
print(f"VALUES fc1.weight {float(x.min())!r} {float(x.max())!r} {int(task.read('step')[0])}")
"""


@pytest.fixture(scope="module")
def nb(lab, browser_context):  # type: ignore[no-untyped-def]
    pg = open_notebook(browser_context, lab, "inspector.ipynb", [SETUP, SHOW, STATE, MORE])
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    out = run_cell(pg, 0)
    facts = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    facts["values"] = {p[1]: (float(p[2]), float(p[3])) for p in (line.split() for line in out.splitlines())
                       if p and p[0] == "VALUES"}
    facts.update(json.loads(next(line[6:] for line in out.splitlines() if line.startswith("STATS "))))
    run_cell(pg, 1)
    view = pg.locator(".rnb-inspector.rnb-live").first
    view.locator(".rnb-insp-opname").wait_for(timeout=60_000)
    pg.facts, pg.view, pg.errors = facts, view, errors  # type: ignore[attr-defined]
    yield pg
    pg.close()


def _at(view) -> tuple[int, str, int]:  # type: ignore[no-untyped-def]
    """The scrubber's tick, op and live bytes as the page shows them."""
    tick = int(view.locator(".rnb-insp-op .rnb-pill[data-tick]").get_attribute("data-tick"))
    return tick, view.locator(".rnb-insp-opname").inner_text(), int(view.locator(".rnb-insp-live").get_attribute("data-bytes"))


def _kernel_state(pg) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(run_cell(pg, 2).strip().splitlines()[-1])


def test_the_scrubber_follows_keys_and_the_slider(nb) -> None:  # type: ignore[no-untyped-def]
    view, f = nb.view, nb.facts
    times = [t for t, *_ in f["ticks"]]
    ops = {t: op for t, op, *_ in f["ticks"]}
    tick, op, live = _at(view)
    assert tick == f["peak"]["train_base"][1] and op == ops[tick] and live == f["curve"][tick] == f["peak"]["train_base"][0]
    i = times.index(tick)
    arena = view.locator("svg.rnb-insp-arena")
    arena.evaluate("e => { e.dataset.drawn = 'once'; }")  # a tick restyles the strip's boxes, never redraws them
    boxes = arena.locator("rect[data-tensor]").count()
    view.locator(".rnb-insp-scrubber .rnb-h").click()  # focus the scrubber panel, then the arrow keys
    for _ in range(3):
        nb.keyboard.press("ArrowRight")
    nb.wait_for_timeout(300)
    tick, op, live = _at(view)
    assert (tick, op, live) == (times[i + 3], ops[times[i + 3]], f["curve"][times[i + 3]])
    assert arena.get_attribute("data-drawn") == "once" and arena.locator("rect[data-tensor]").count() == boxes
    assert int(view.locator(".rnb-insp-marker").get_attribute("data-tick")) == times[i + 3]
    slider = view.locator("input.rnb-insp-slider")
    slider.focus()
    nb.keyboard.press("ArrowLeft")  # the slider's own key handling
    nb.wait_for_timeout(300)
    assert _at(view)[0] == times[i + 2] and int(slider.input_value()) == i + 2
    box = slider.bounding_box()
    slider.click(position={"x": 2, "y": box["height"] / 2})  # the slider's far left: the step's first node
    nb.wait_for_timeout(300)
    tick, op, live = _at(view)
    assert (tick, op, live) == (times[0], ops[times[0]], f["curve"][times[0]])
    assert op == "transfer" and view.locator(".rnb-insp-writes .rnb-insp-chip").count() >= 1
    assert _kernel_state(nb)["tick"] == times[0]  # the pick reached Python
    # the optimizer's node: its region-wide reads and writes are listed and outlined on the arena
    opt = times.index(next(t for t, op, *_ in f["ticks"] if op == "optimizer"))
    view.locator(".rnb-insp-scrubber .rnb-h").click()
    for _ in range(opt):
        nb.keyboard.press("ArrowRight")
    nb.wait_for_timeout(300)
    assert _at(view)[1] == "optimizer"
    assert "W_BN_BIAS…W_DEEP_CONV" in view.locator(".rnb-insp-ranges").inner_text()
    assert int(view.locator(".rnb-insp-reads").get_attribute("data-count")) >= 16  # W, G, M, V of 4 layers
    assert view.locator(".rnb-insp-arena rect[data-tensor='fc1.weight@m'][stroke='#1f2328']").count() == 1
    shot(view.locator(".rnb-insp-scrubber"), "30_inspector_scrubber.png")
    # the static copy kept for a saved notebook (hidden behind the live view) follows the scrubber too
    copy = nb.locator(".rnb-static-copy[data-view='MemoryInspectorView'] .rnb-inspector-static").first
    nb.wait_for_function("t => document.querySelector(\".rnb-static-copy[data-view='MemoryInspectorView']\")"
                         "?.textContent.includes(`tick ${t} `)", arg=_at(view)[0], timeout=30_000)
    assert "optimizer" in copy.text_content() and copy.locator("svg.rnb-insp-strip").count() == 2


def test_a_what_if_toggle_changes_the_diff(nb) -> None:  # type: ignore[no-untyped-def]
    view, f = nb.view, nb.facts
    view.locator("input[data-setting='liveness']").uncheck()
    summary = view.locator(".rnb-whatif-summary")
    summary.wait_for(timeout=30_000)
    assert summary.inner_text() == f["no_reuse"][1]
    assert int(view.locator(".rnb-insp-side-whatif .rnb-insp-arena-bytes").get_attribute("data-bytes")) == f["no_reuse"][0]
    assert int(view.locator(".rnb-insp-side-current .rnb-insp-arena-bytes").get_attribute("data-bytes")) == f["arena"]
    view.locator("select.rnb-insp-optimizer").select_option("sgd")
    nb.wait_for_function("s => document.querySelector(s)?.innerText.includes('optimizer=sgd')",
                         arg=".rnb-inspector.rnb-live .rnb-whatif-summary", timeout=30_000)
    assert summary.inner_text() == f["no_reuse_sgd"][1]
    assert int(view.locator(".rnb-insp-side-whatif .rnb-insp-arena-bytes").get_attribute("data-bytes")) == f["no_reuse_sgd"][0]
    assert "peak (train_base)" in view.locator(".rnb-insp-side-whatif").inner_text()  # the variant it is of
    rows = view.locator(".rnb-insp-diff-category tr[data-name='optimizer state'] td").all_inner_texts()
    assert rows[2] == "0 B" and rows[3].startswith("−")  # SGD keeps no moments
    assert _kernel_state(nb)["what_if"] == {"liveness": False, "optimizer": "sgd"}
    for bad in ("0", "-3", ""):  # checked in the page: Python's Int never gets a null or a zero budget
        view.locator("input.rnb-insp-budget").fill(bad)
        view.locator("button.rnb-insp-fit-btn").click()
        assert "must be a number of MiB above 0" in view.locator(".rnb-insp-budget-error").inner_text()
    assert _kernel_state(nb)["fit_budget"] == 0 and not nb.errors, nb.errors
    view.locator("input.rnb-insp-budget").fill("20")
    view.locator("button.rnb-insp-fit-btn").click()
    view.locator(".rnb-insp-fit-batch").wait_for(timeout=60_000)
    assert int(view.locator(".rnb-insp-fit-batch").inner_text()) == f["fit"]
    assert "with liveness=False, optimizer=sgd" in view.locator(".rnb-insp-fit").inner_text()
    shot(view.locator(".rnb-insp-whatif"), "31_inspector_whatif.png")


def _number(view, sel: str) -> tuple[float, str]:  # type: ignore[no-untyped-def]
    """A number as the page shows it: its exact value (data-value) and the text printed."""
    at = view.locator(sel)
    return float(at.get_attribute("data-value")), (at.locator("b") if at.locator("b").count() else at).text_content()


def test_integers_and_histogram_edges_print_their_own_digits(nb) -> None:  # type: ignore[no-untyped-def]
    """cursor (one int64, 1280 after the first epoch): numpy's histogram spans [1279.5, 1280.5]; the edges print
    to 4 significant digits ("1280", once "128": the trailing zeros of an integer were stripped)."""
    view, (lo, hi, low, high) = nb.view, nb.facts["cursor"]
    view.locator(".rnb-insp-arena rect[data-tensor='cursor']").dispatch_event("click")
    nb.wait_for_function("() => document.querySelector('.rnb-inspector.rnb-live .rnb-insp-tensor-name')"
                         "?.innerText === 'cursor'", timeout=30_000)
    view.locator(".rnb-insp-edge-lo").wait_for(timeout=30_000)
    for cls, edge in (("lo", lo), ("hi", hi)):
        value, text = _number(view, f".rnb-insp-edge-{cls}")
        assert value == edge and float(text) == pytest.approx(edge, rel=5e-4) and len(text.replace(".", "")) >= 4
    assert _number(view, ".rnb-insp-min") == (low, f"{int(low):,}") == (1280.0, "1,280")
    assert _number(view, ".rnb-insp-max") == (high, f"{int(high):,}")


def test_a_clicked_tensor_shows_its_values(nb) -> None:  # type: ignore[no-untyped-def]
    view, f = nb.view, nb.facts
    view.locator(".rnb-insp-peak-table tr[data-tensor='fc1.weight']").click()
    nb.wait_for_function("() => document.querySelector('.rnb-inspector.rnb-live .rnb-insp-tensor-name')"
                         "?.innerText === 'fc1.weight'", timeout=30_000)
    view.locator(".rnb-insp-min").wait_for(timeout=30_000)
    lo, hi = (float(view.locator(f".rnb-insp-{k}").get_attribute("data-value")) for k in ("min", "max"))
    assert (lo, hi) == pytest.approx(f["values"]["fc1.weight"], rel=1e-7)
    assert sum(int(c) for c in view.locator(".rnb-insp-hist rect").evaluate_all("rs => rs.map(r => r.dataset.count)")) \
        == int(view.locator(".rnb-insp-size").get_attribute("data-value")) == 1024 * 784
    u = f["update"]  # Python's numbers, exactly in data-value, to 5 significant digits in the text
    for cls, key in (("ratio", "ratio"), ("gnorm", "grad_norm"), ("dnorm", "update_norm"), ("wnorm", "weight_norm")):
        value, text = _number(view, f".rnb-insp-{cls}")
        assert value == u[key] and float(text) == pytest.approx(u[key], rel=5e-5), (cls, text)
    assert view.locator(".rnb-insp-arena rect[data-tensor='fc1.weight'].rnb-picked").count() == 1
    assert view.locator(".rnb-insp-peak-table tr.rnb-picked").get_attribute("data-tensor") == "fc1.weight"
    assert int(view.locator(".rnb-insp-nan").get_attribute("data-value")) == 0
    shot(view.locator(".rnb-insp-tensor"), "32_inspector_tensor.png")
    # the arena strip and the what-if's moved tensors are clickable too
    view.locator(".rnb-insp-arena rect[data-tensor='fc2.weight']").click()
    nb.wait_for_function("() => document.querySelector('.rnb-inspector.rnb-live .rnb-insp-tensor-name')"
                         "?.innerText === 'fc2.weight'", timeout=30_000)
    lo, hi = (float(view.locator(f".rnb-insp-{k}").get_attribute("data-value")) for k in ("min", "max"))
    assert (lo, hi) == pytest.approx(f["values"]["fc2.weight"], rel=1e-7)
    moved = view.locator(".rnb-insp-moved tr[data-tensor]").first
    target = moved.get_attribute("data-tensor")
    moved.click()
    nb.wait_for_function("t => document.querySelector('.rnb-inspector.rnb-live .rnb-insp-tensor-name')?.innerText === t",
                         arg=target, timeout=30_000)
    assert _kernel_state(nb)["selected"] == target
    # the widget follows its task: another epoch trained in code, and the inspector shows the new values
    view.locator(".rnb-insp-peak-table tr[data-tensor='fc1.weight']").click()
    nb.wait_for_function("() => document.querySelector('.rnb-inspector.rnb-live .rnb-insp-tensor-name')"
                         "?.innerText === 'fc1.weight'", timeout=30_000)
    out = run_cell(nb, 3)
    lo, hi, step = next(line.split()[2:] for line in out.splitlines() if line.startswith("VALUES"))
    nb.wait_for_function("s => document.querySelector('.rnb-inspector.rnb-live .rnb-insp-gnorm')?.innerText"
                         ".includes(`(step ${s})`)", arg=step, timeout=30_000)
    got = tuple(float(view.locator(f".rnb-insp-{k}").get_attribute("data-value")) for k in ("min", "max"))
    assert step == "20" and got == pytest.approx((float(lo), float(hi)), rel=1e-7)
    assert got != pytest.approx(f["values"]["fc1.weight"], rel=1e-7)
    assert not nb.errors, nb.errors
