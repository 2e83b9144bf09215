"""A real browser reads the whole training step in GraphView: the seed MLP and the ResNet block net of
notebooks/08_image_models.ipynb, "all GraphIds", in a 1280 px wide JupyterLab.

Readable is measured, not looked at: after the view's own default fit, every op and tensor name
(graphviz's bold text) is drawn at 9 px or more (its font size times the screen matrix of its text).
The search box lights a tensor and its neighbours; the static copy kept for a saved notebook holds the
same drawing. Screenshots 20_graph_mlp_whole_step.png and 21_graph_resnet_whole_step.png go to SHOTS,
the measured sizes to SHOTS/graph_readability.json.
"""
from __future__ import annotations

import json

import pytest

from browser_lab import SHOTS, open_notebook, run_cell, shot, skip_without_browser

pytestmark = skip_without_browser()

SETUP = """
from renaissance_nb import (DeepLearningTask, AdamW, CosineAnnealingLR, RESNET_3_3, RESNET_3_3_DS, block, cbr,
                            datasets, fc, gap, maxpool, relu, seq)
from renaissance_nb.display import GraphView
mlp = (DeepLearningTask("seed-mlp").model(seq(fc(1024), relu(), fc(1024), relu(), fc(10)))
       .data(datasets.default_mnist(), batch_size=128).lock_memory())
net = seq(cbr(8, 3, 1, 1), maxpool(2), block(8, RESNET_3_3), block(16, RESNET_3_3_DS), gap(), fc(10))
resnet = (DeepLearningTask("resnet-mnist").model(net).data(datasets.default_mnist(layout="image"), batch_size=96)
          .optimizer(AdamW().lr(3e-3)).scheduler(CosineAnnealingLR()).train_resolution(20, 28, boundary_epoch=2)
          .ema(0.99).total_epochs(4).seed(0).lock_memory())
print("GRAPHIDS", len(mlp.graphs.train.ids()), len(resnet.graphs.train.ids()))
"""
CELLS = [SETUP, 'GraphView(mlp, gid="")', 'GraphView(resnet, gid="")']
READABLE_PX = 9.0

MEASURE = """(view) => {
  const canvas = view.querySelector('.rnb-graph-canvas'), svg = canvas.querySelector(':scope > svg');
  const px = (t) => parseFloat(t.getAttribute('font-size')) * t.getScreenCTM().a;
  const texts = [...svg.querySelectorAll('g.node text')];
  const names = texts.filter((t) => t.getAttribute('font-weight') === 'bold').map(px);
  const all = texts.map(px);
  return { zoom: Number(canvas.dataset.zoom), canvas: canvas.clientWidth, natural: Number(svg.dataset.w),
           shown: svg.getBoundingClientRect().width, names: names.length, texts: all.length,
           min_name_px: Math.min(...names), min_text_px: Math.min(...all),
           frames: [...svg.querySelectorAll("g.cluster[id^='gid_']")].map((g) => g.id.slice(4)) };
}"""


@pytest.fixture(scope="module")
def nb(lab, browser_context):  # type: ignore[no-untyped-def]
    pg = open_notebook(browser_context, lab, "graph_whole_step.ipynb", CELLS)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    out = run_cell(pg, 0)
    pg.gids = [int(x) for x in next(line for line in out.splitlines() if line.startswith("GRAPHIDS")).split()[1:]]  # type: ignore[attr-defined]
    for i in (1, 2):
        run_cell(pg, i)
        pg.locator(".jp-Cell").nth(i).locator(".rnb-graph.rnb-live .rnb-graph-canvas svg g.node").first.wait_for(
            timeout=60_000)
    pg.wait_for_timeout(800)  # the fit follows the canvas's width once it is laid out
    pg.errors, pg.measured = errors, {}  # type: ignore[attr-defined]
    yield pg
    (SHOTS / "graph_readability.json").write_text(json.dumps(pg.measured, indent=1))  # type: ignore[attr-defined]
    pg.close()


@pytest.mark.parametrize("cell,name,shot_name,query", [
    (1, "seed MLP", "20_graph_mlp_whole_step.png", "fc1.weight"),
    (2, "ResNet block net", "21_graph_resnet_whole_step.png", "conv2.weight"),
])
def test_the_whole_step_is_readable_at_1280_px(nb, cell: int, name: str, shot_name: str, query: str) -> None:  # type: ignore[no-untyped-def]
    view = nb.locator(".jp-Cell").nth(cell).locator(".rnb-graph.rnb-live")
    canvas = view.locator(".rnb-graph-canvas")
    assert view.locator("select[data-role='gid']").input_value() == "", "the view opened on all GraphIds"
    m = view.evaluate(MEASURE)
    nb.measured[name] = m
    print(f"{name}: drawing {m['natural']:.0f} px natural, canvas {m['canvas']} px, fitted at {m['zoom']:.2f}: "
          f"names {m['min_name_px']:.1f} px and up, every text {m['min_text_px']:.1f} px and up")
    assert len(m["frames"]) == nb.gids[cell - 1], "one frame per GraphId of the step"
    assert m["names"] > 40 and m["min_name_px"] >= READABLE_PX, m
    assert m["shown"] <= max(m["canvas"], m["natural"] * 0.75 + 1), "fitted to the width, or held at 75%"
    shot(view, shot_name)
    # the static copy kept for a saved notebook holds the same drawing, fitted by the same rule
    copy = nb.locator(".jp-Cell").nth(cell).locator(".rnb-static-copy[data-view='GraphView'] svg.rnb-graph-svg")
    live_box = canvas.locator(":scope > svg").get_attribute("viewBox")
    assert copy.get_attribute("viewBox") == live_box
    assert f"min-width:{m['natural'] * 0.75:.0f}px" in (copy.get_attribute("style") or "")
    # search: every drawing of the tensor lit, with the ops that read or write it; the rest dimmed
    view.locator("input.rnb-graph-search").fill(query)
    named = [t for t in canvas.locator("g.node.rnb-hit").all_text_contents() if query in t]
    assert len(named) >= 2, "a weight is drawn where the forward pass and the backward pass read it"
    # (a range the optimizer sweeps lights too: its tooltip lists the weight); outlined in red: a whole box,
    # or in a box listing several tensors the cell of the one found
    red = canvas.evaluate("""c => [...c.querySelectorAll('g.node.rnb-hit path, g.node.rnb-hit polygon')]
        .filter(e => getComputedStyle(e).stroke === 'rgb(217, 45, 32)').length""")
    assert red >= 2
    cells = canvas.locator("text.rnb-hit-cell").all_text_contents()
    assert not cells or any(query in t for t in cells)
    assert canvas.locator("g.node.rnb-near[id^='op']").count() >= 2 and canvas.locator("g.edge.rnb-near").count() >= 2
    assert canvas.evaluate("c => c.classList.contains('rnb-searching')")
    dimmed = canvas.locator("g.node:not(.rnb-hit):not(.rnb-near)").first.evaluate("g => getComputedStyle(g).opacity")
    assert float(dimmed) < 0.5
    assert "match" in view.locator(".rnb-graph-info").inner_text()
    view.locator("input.rnb-graph-search").fill("")
    assert canvas.locator("g.node.rnb-hit").count() == 0
    assert not nb.errors, nb.errors


def test_whole_graph_minimap_and_details(nb) -> None:  # type: ignore[no-untyped-def]
    """"whole" puts the ResNet step's whole drawing in view; the minimap frames the part in view; a click on a
    tensor opens its details (shape per variant, region, offset, writers, readers), a click on an op its own."""
    view = nb.locator(".jp-Cell").nth(2).locator(".rnb-graph.rnb-live")
    canvas = view.locator(".rnb-graph-canvas")
    view.locator("button[data-action='fit-all']").click()
    box = canvas.evaluate("c => { const s = c.querySelector(':scope > svg').getBoundingClientRect(); "
                          "return [s.width, s.height, c.clientWidth, c.clientHeight]; }")
    assert box[0] <= box[2] and box[1] <= box[3], box
    frame = view.locator(".rnb-minimap .rnb-minimap-view")
    assert view.locator(".rnb-minimap svg").count() == 1 and frame.count() == 1
    shot(view, "22_graph_whole_minimap.png")
    view.locator("button[data-action='zoom-1']").click()
    small = frame.evaluate("f => [f.offsetWidth, f.offsetHeight, f.parentElement.clientWidth, f.parentElement.clientHeight]")
    assert 0 < small[0] <= small[2] + 4 and 0 < small[1] < small[3] / 2, small  # the part in view, of a tall map
    canvas.locator("g.node", has_text="conv2.weight").first.click()
    panel = view.locator(".rnb-graph-details[data-kind='tensor']")
    panel.wait_for(timeout=15_000)
    text = panel.inner_text().lower()  # the headings are upper case on screen
    assert "conv2.weight" in text and "written by" in text and "read by" in text
    assert panel.locator("tr[data-variant]").count() == 6
    shot(view, "23_graph_details.png")
    canvas.locator("g.node[id^='op']").first.click()
    view.locator(".rnb-graph-details[data-kind='op']").wait_for(timeout=15_000)
    assert "GraphId" in view.locator(".rnb-graph-details").inner_text()
