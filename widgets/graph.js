// GraphView: pick a graph and a GraphId, fold layers (chips, or click a layer's frame in the
// drawing). Python draws with graphviz; without `dot` it sends an HTML table and a note.

const safe = (name) => name.replace(/[^A-Za-z0-9_]/g, "_");

const STREAMS = { TRANS: "#d06ba6", COMP_1: "#3b6fb6", COMP_2: "#2f9c95", COMP_3: "#a58fd6", UPDATE: "#e07b39" };

// The minimap: the drawing small, a frame over the part of it in view; a click there scrolls to it.
function minimap(canvas, svg) {
  const mini = h("div", { class: "rnb-minimap", title: "the whole graph: click to go there" });
  const frame = h("div", { class: "rnb-minimap-view" });
  function drawMini() {
    const e = svg();
    mini.replaceChildren();
    mini.style.display = e ? "" : "none";
    if (!e) return;
    const aspect = Number(e.dataset.h) / Math.max(Number(e.dataset.w), 1);  // the map keeps the drawing's shape
    mini.style.width = `${Math.round(Math.max(48, Math.min(170, 220 / aspect)))}px`;
    mini.style.height = `${Math.round(Math.max(48, Math.min(220, 170 * aspect)))}px`;
    const copy = e.cloneNode(true);
    for (const x of [copy, ...copy.querySelectorAll("[id]")]) x.removeAttribute("id");  // ids stay the drawing's
    copy.setAttribute("width", "100%");
    copy.setAttribute("height", "100%");
    copy.setAttribute("preserveAspectRatio", "xMinYMin meet");
    mini.append(copy, frame);
    place();
  }
  function place() {
    const e = svg();
    if (!e || !mini.firstChild) return;
    const k = Math.min(mini.clientWidth / Number(e.dataset.w), mini.clientHeight / Number(e.dataset.h)) / (Number(canvas.dataset.zoom) || 1);
    Object.assign(frame.style, { left: `${canvas.scrollLeft * k}px`, top: `${canvas.scrollTop * k}px`,
      width: `${Math.min(canvas.clientWidth * k, mini.clientWidth)}px`, height: `${Math.min(canvas.clientHeight * k, mini.clientHeight)}px` });
  }
  mini.addEventListener("click", (ev) => {
    const e = svg();
    if (!e) return;
    const r = mini.getBoundingClientRect();
    const k = Math.min(r.width / Number(e.dataset.w), r.height / Number(e.dataset.h)) / (Number(canvas.dataset.zoom) || 1);
    canvas.scrollTo((ev.clientX - r.left) / k - canvas.clientWidth / 2, (ev.clientY - r.top) / k - canvas.clientHeight / 2);
  });
  canvas.addEventListener("scroll", place);
  return { el: mini, draw: drawMini, place };
}

// Fit, zoom, pan and search over a graphviz drawing. The SVG keeps its natural size in data-w/data-h;
// zoom rescales width and height (the viewBox stays), drag pans the scrolling canvas, the search box
// lights a tensor or op and its neighbours (graphviz titles its edges "a->b") and dims the rest.
// "fit" fits the width, the height scrolls, and never below READABLE: the labels (10 pt, 12.5 px at
// natural size) stay at 9 px or more; a drawing wider than that scrolls sideways too.
const READABLE = 0.75;

function navigator(canvas, onPick) {
  let zoom = null;  // null: fit to width
  const info = h("span", { class: "rnb-muted rnb-graph-info" });
  const search = h("input", { class: "rnb-graph-search", type: "search", placeholder: "find a tensor or op…",
    oninput: () => highlight(search.value.trim().toLowerCase()) });
  const zoomText = h("span", { class: "rnb-muted rnb-zoom-text" });
  const btn = (label, action, f, title) => h("button", { class: "rnb-btn rnb-quiet", "data-action": action, title, onclick: f }, label);
  const bar = h("div", { class: "rnb-row rnb-graph-tools" }, search,
    btn("fit", "fit", () => { zoom = null; apply(); }, "fit the drawing to the width (never below a readable size)"),
    btn("whole", "fit-all", () => { zoom = wholeScale(); apply(); canvas.scrollTo(0, 0); }, "the whole graph in view (f)"),
    btn("−", "zoom-out", () => { zoom = scale() / 1.25; apply(); }, "zoom out"),
    btn("+", "zoom-in", () => { zoom = scale() * 1.25; apply(); }, "zoom in"),
    btn("1:1", "zoom-1", () => { zoom = 1; apply(); }, "natural size"), zoomText, info);
  const svg = () => canvas.querySelector(":scope > svg");
  function scale() {
    const e = svg();
    if (!e) return 1;
    if (zoom != null) return zoom;
    const avail = Math.max((canvas.clientWidth || 880) - 18, 200);
    return Math.min(1, Math.max(READABLE, avail / Number(e.dataset.w)));
  }
  function wholeScale() {  // the whole drawing inside the canvas, however small its labels then are
    const e = svg();
    if (!e) return 1;
    const w = Math.max((canvas.clientWidth || 880) - 18, 100), ht = Math.max((parseFloat(getComputedStyle(canvas).maxHeight) || 640) - 18, 100);
    return Math.min(1, w / Number(e.dataset.w), ht / Number(e.dataset.h));
  }
  const map = minimap(canvas, svg);
  function apply() {
    const e = svg();
    if (!e) return;
    const k = Math.min(Math.max(scale(), 0.02), 4);  // "whole" may take a 12,000 px step down to 5%
    e.setAttribute("width", `${(Number(e.dataset.w) * k).toFixed(0)}px`);
    e.setAttribute("height", `${(Number(e.dataset.h) * k).toFixed(0)}px`);
    canvas.dataset.zoom = k.toFixed(3);
    zoomText.textContent = `${Math.round(100 * k)}%`;
    map.place();
  }
  function highlight(q) {
    const nodes = [...canvas.querySelectorAll("g.node")], edges = [...canvas.querySelectorAll("g.edge")];
    for (const x of [...nodes, ...edges]) x.classList.remove("rnb-hit", "rnb-near");
    for (const x of canvas.querySelectorAll(".rnb-hit-cell")) x.classList.remove("rnb-hit-cell");
    canvas.classList.toggle("rnb-searching", !!q);
    if (!q) { info.textContent = ""; return; }
    const byName = new Map(nodes.map((n) => [n.querySelector("title")?.textContent, n]));
    const hits = nodes.filter((n) => n.textContent.toLowerCase().includes(q) ||
      (n.querySelector("a")?.getAttribute("xlink:title") || "").toLowerCase().includes(q));
    const hitNames = new Set(hits.map((n) => n.querySelector("title")?.textContent));
    for (const n of hits) {
      n.classList.add("rnb-hit");
      if (/^(reads|writes)_/.test(n.id)) markCells(n, q);
    }
    for (const e of edges) {
      const [a, b] = (e.querySelector("title")?.textContent || "").split("->");
      if (hitNames.has(a) || hitNames.has(b)) {
        e.classList.add("rnb-near");
        for (const end of [a, b]) if (!hitNames.has(end) && byName.has(end)) byName.get(end).classList.add("rnb-near");
      }
    }
    info.textContent = hits.length ? `${plural(hits.length, "match", "matches")} and their neighbours` : "no match";
    if (hits.length) hits[0].scrollIntoView({ block: "center", inline: "center" });
  }
  // a box listing several tensors (graphlayout's groups): each cell is a border (path) and its texts;
  // the cells holding the query are outlined, not the whole box
  function markCells(node, q) {
    node.classList.add("rnb-group");
    let cell = null;
    const cells = [];
    for (const e of node.querySelectorAll("path, polygon, text")) {
      if (e.tagName !== "text") cells.push(cell = { border: e, texts: [] });
      else if (cell) cell.texts.push(e);
    }
    for (const c of cells) {
      if (c.texts.map((t) => t.textContent).join("").toLowerCase().includes(q)) {
        for (const e of [c.border, ...c.texts]) e.classList.add("rnb-hit-cell");
      }
    }
  }
  // drag to pan; a click on an op shows its full parameters (the drawing truncates them)
  let drag = null;
  canvas.addEventListener("mousedown", (ev) => { drag = { x: ev.clientX, y: ev.clientY, l: canvas.scrollLeft, t: canvas.scrollTop, moved: false }; });
  window.addEventListener("mousemove", (ev) => {
    if (!drag) return;
    const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) { drag.moved = true; canvas.classList.add("rnb-panning"); }
    canvas.scrollLeft = drag.l - dx; canvas.scrollTop = drag.t - dy;
  });
  window.addEventListener("mouseup", () => { drag = null; canvas.classList.remove("rnb-panning"); });
  canvas.addEventListener("wheel", (ev) => {
    if (!ev.ctrlKey) return;
    ev.preventDefault();
    zoom = scale() * (ev.deltaY < 0 ? 1.1 : 1 / 1.1);
    apply();
  }, { passive: false });
  canvas.addEventListener("click", (ev) => {
    const node = ev.target.closest && ev.target.closest("g.node");
    if (!node || node.id.startsWith("layer_")) return;
    info.textContent = node.querySelector("a")?.getAttribute("xlink:title") || "";
    info.dataset.node = node.id;
    if (drag && drag.moved) return;
    const op = /^op(\d+)$/.exec(node.id);
    if (op) { onPick({ op: Number(op[1]) }); return; }
    // a tensor box says "name #id"; a group box, one cell per tensor: the clicked cell's "#id"
    const near = [ev.target, ev.target.nextElementSibling, ev.target.previousElementSibling].filter(Boolean).map((x) => x.textContent).join(" ");
    const id = /#(\d+)/.exec(near) || /#(\d+)/.exec(node.textContent);
    if (id) onPick({ tensor: Number(id[1]) });
  }, true);
  function adopt() {  // a new drawing arrived: remember its natural size, keep the zoom chosen
    const e = svg();
    bar.style.display = e ? "" : "none";
    if (!e) return;
    e.dataset.w = parseFloat(e.getAttribute("width")) || e.viewBox.baseVal.width;
    e.dataset.h = parseFloat(e.getAttribute("height")) || e.viewBox.baseVal.height;
    apply();
    map.draw();
    if (search.value.trim()) highlight(search.value.trim().toLowerCase());
  }
  const keys = (e) => {  // f: the whole graph; + and −: zoom; /: the search box
    if (e.target.matches && e.target.matches("input, select")) return false;
    const act = { f: () => { zoom = wholeScale(); apply(); }, "+": () => { zoom = scale() * 1.25; apply(); },
      "=": () => { zoom = scale() * 1.25; apply(); }, "-": () => { zoom = scale() / 1.25; apply(); }, "/": () => search.focus() }[e.key];
    if (!act) return false;
    e.preventDefault();
    act();
    return true;
  };
  // fitted once the canvas has its width (a view drawn before it is in the page, a tab shown later, a
  // narrower window): while the user has not zoomed, a change of width fits again
  const resized = typeof ResizeObserver === "undefined" ? null : new ResizeObserver(() => { if (zoom == null) apply(); });
  if (resized) resized.observe(canvas);
  return { bar, mini: map.el, keys, adopt, apply, stop: () => resized && resized.disconnect() };
}

// The details panel: a clicked tensor's shape in every variant, region, offset, bytes and the ops that
// write and read it; a clicked op's GraphId, stream, parameters and operands (display/graphpick.py).
function details(panel, model) {
  const d = model.get("details") || {};
  const close = h("button", { class: "rnb-btn rnb-quiet", onclick: () => { model.set("picked", {}); model.save_changes(); } }, "close");
  const list = (xs) => (xs.length ? h("ul", { class: "rnb-graph-list" }, ...xs.map((x) => h("li", { class: "rnb-mono" }, x))) : h("span", { class: "rnb-muted" }, "none"));
  const row = (k, v) => h("tr", {}, h("th", {}, k), h("td", {}, v));
  panel.dataset.kind = d.kind || "";
  panel.style.display = d.kind || d.error ? "" : "none";  // the drawing keeps the width until something is clicked
  if (d.error) { panel.replaceChildren(h("div", { class: "rnb-error" }, d.error)); return; }
  if (d.kind === "tensor") {
    panel.replaceChildren(h("div", { class: "rnb-row" }, h("span", { class: "rnb-swatch", style: { background: d.color } }),
      h("b", { class: "rnb-mono", "data-tensor": d.name }, d.name), h("span", { class: "rnb-muted" }, `#${d.id}`), h("span", { class: "rnb-grow" }), close),
    h("table", { class: "rnb-table" }, row("dtype", d.dtype), row("region", `${d.region} (${d.family})`),
      row("offset", `${d.offset.toLocaleString()} (0x${d.offset.toString(16)})`), row("slot", d.slot_human)),
    h("table", { class: "rnb-table rnb-graph-shapes" }, h("tr", {}, h("th", {}, "variant"), h("th", {}, "shape"), h("th", { class: "rnb-num" }, "bytes")),
      ...d.variants.map((v) => h("tr", { "data-variant": v.variant }, h("td", {}, v.variant), h("td", { class: "rnb-mono" }, v.shape), h("td", { class: "rnb-num", "data-bytes": v.bytes }, v.human)))),
    h("div", { class: "rnb-h" }, `written by ${d.writers.length}`), list(d.writers), h("div", { class: "rnb-h" }, `read by ${d.readers.length}`), list(d.readers));
  } else if (d.kind === "op") {
    panel.replaceChildren(h("div", { class: "rnb-row" }, h("b", { class: "rnb-mono", "data-op": d.op }, d.op), h("span", { class: "rnb-muted" }, d.layer),
      h("span", { class: "rnb-grow" }), close),
    h("table", { class: "rnb-table" }, row("GraphId", d.graph_id), row("stream", d.stream), ...d.params.map(([k, v]) => row(k, v))),
    h("div", { class: "rnb-h" }, `reads ${d.reads.length}`), list(d.reads), h("div", { class: "rnb-h" }, `writes ${d.writes.length}`), list(d.writes));
  } else panel.replaceChildren();
}

function render({ model, el }) {
  el.classList.add("rnb", "rnb-card", "rnb-graph");
  const controls = h("div", { class: "rnb-row" });
  const chips = h("div", { class: "rnb-row", style: { margin: "8px 0" } });
  const note = h("div");
  const canvas = h("div", { class: "rnb-graph-canvas" });
  const legend = h("div", { class: "rnb-legend" });
  const panel = h("div", { class: "rnb-graph-details" });
  const nav = navigator(canvas, (p) => { model.set("picked", p); model.save_changes(); });
  liveView(model, el, [["f", "the whole graph in view"], ["+ −", "zoom in or out"], ["/", "find a tensor or op"]], nav.keys);
  const drawDetails = () => details(panel, model);
  el.append(h("div", { class: "rnb-title" }, "ComputationGraph"),
    h("div", { class: "rnb-sub" }, "Ops are boxes coloured by stream; tensors carry their name, id and the shape in the chosen variant's plan. "
      + "All GraphIds: one frame each, in the order a step runs them; a tensor is drawn again where a later op reads it. "
      + "Click a layer's frame (or its chip) to fold it, an op or a tensor for its details; drag to pan, Ctrl+wheel to zoom."),
    controls, chips, note, nav.bar, h("div", { class: "rnb-graph-body" }, h("div", { class: "rnb-graph-main" }, canvas, nav.mini), panel), legend);

  function toggle(layer) {
    const c = new Set(model.get("collapsed"));
    if (c.has(layer)) c.delete(layer); else c.add(layer);
    model.set("collapsed", [...c]);
    model.save_changes();
  }

  function drawControls() {
    const v = model.get("view") || {};
    controls.replaceChildren();
    if (!v.ready) {
      controls.append(h("div", { class: "rnb-note" }, "No graphs yet: lock_memory() (or add_graph()) builds them."));
      return;
    }
    const graph = model.get("graph");
    const g = (v.graphs || []).find((x) => x.name === graph) || { gids: [], streams: {} };
    const pickGraph = h("select", { class: "rnb-select", "data-role": "graph",
      onchange: (ev) => { model.set("graph", ev.target.value); model.save_changes(); } },
      ...(v.graphs || []).map((x) => h("option", { value: x.name, selected: x.name === graph }, `${x.name} (${plural(x.nodes, "node")})`)));
    const pickGid = h("select", { class: "rnb-select", "data-role": "gid",
      onchange: (ev) => { model.set("gid", ev.target.value); model.save_changes(); } },
      h("option", { value: "", selected: model.get("gid") === "" }, "all GraphIds"),
      ...g.gids.map((x) => h("option", { value: x, selected: x === model.get("gid") }, `${x} · ${g.streams[x]}`)));
    controls.append(h("span", { class: "rnb-muted" }, "graph"), pickGraph);
    if (!v.hand) controls.append(h("span", { class: "rnb-muted" }, "GraphId"), pickGid);
    if ((v.variants || []).length > 1) {
      controls.append(h("span", { class: "rnb-muted" }, "shapes of"),
        h("select", { class: "rnb-select", "data-role": "variant",
          onchange: (ev) => { model.set("variant", ev.target.value); model.save_changes(); } },
          ...v.variants.map((x) => h("option", { value: x, selected: x === model.get("variant") }, x))));
    }
    legend.replaceChildren(...Object.entries(STREAMS).map(([k, c]) =>
      h("span", {}, h("span", { class: "rnb-swatch", style: { background: c } }), k)),
      h("span", {}, "· tensor outline = region family colour"));
  }

  function drawChips() {
    chips.replaceChildren();
    const layers = model.get("layers") || [];
    if (!layers.length) return;
    const collapsed = new Set(model.get("collapsed"));
    chips.append(h("span", { class: "rnb-muted" }, "layers"));
    for (const l of layers) {
      chips.append(h("button", { class: "rnb-chip" + (collapsed.has(l) ? " rnb-off" : ""), "data-layer": l,
        title: collapsed.has(l) ? "folded: click to expand" : "click to fold", onclick: () => toggle(l) }, l));
    }
    chips.append(
      h("button", { class: "rnb-btn rnb-quiet", onclick: () => { model.set("collapsed", []); model.save_changes(); } }, "expand all"),
      h("button", { class: "rnb-btn rnb-quiet", onclick: () => { model.set("collapsed", [...layers]); model.save_changes(); } }, "fold all"));
  }

  function drawCanvas() {
    const svg = model.get("svg"), table = model.get("table"), text = model.get("note");
    note.replaceChildren(...(text ? [h("div", { class: "rnb-note rnb-graph-note" }, text)] : []));
    canvas.dataset.mode = svg ? "svg" : "table";
    canvas.innerHTML = svg || table || "";
    const bySafe = new Map((model.get("layers") || []).map((l) => [safe(l), l]));
    for (const g of canvas.querySelectorAll("g[id^='layer_']")) {  // layer_<name>, layer_<name>-<n>: each run
      const layer = bySafe.get(g.id.slice(6).replace(/-\d+$/, ""));
      if (layer == null) continue;
      g.addEventListener("click", (ev) => { ev.stopPropagation(); toggle(layer); });
    }
    for (const th of canvas.querySelectorAll("th[data-layer]")) {
      th.style.cursor = "pointer";
      th.addEventListener("click", () => toggle(th.dataset.layer));
    }
    nav.adopt();
    const captured = model.get("captured");
    if (captured) {  // what the step runs for this graph, below it: the CUDA graph (GPU), the C calls (CPU)
      const box = h("div", { class: "rnb-captured" }, h("div", { class: "rnb-sub" }, model.get("captured_caption")));
      const body = h("div");
      body.innerHTML = captured;
      box.append(body);
      canvas.append(box);
    }
  }

  exportBar(el, { name: "graph", picture: () => canvas.querySelector(":scope > svg") || canvas.querySelector("table") });
  const all = () => { drawControls(); drawChips(); drawCanvas(); };
  all();
  const on = [["change:view", all], ["change:graph", drawControls], ["change:gid", drawControls], ["change:variant", drawControls],
    ["change:layers", drawChips], ["change:collapsed", drawChips], ["change:svg", drawCanvas], ["change:table", drawCanvas],
    ["change:note", drawCanvas], ["change:captured", drawCanvas], ["change:captured_caption", drawCanvas], ["change:details", drawDetails]];
  drawDetails();
  for (const [e, f] of on) model.on(e, f);
  return () => { nav.stop(); for (const [e, f] of on) model.off(e, f); };
}

export default { render };
