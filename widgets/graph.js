// GraphView: pick a graph and a GraphId, fold layers (chips, or click a layer's frame in the
// drawing). Python draws with graphviz; without `dot` it sends an HTML table and a note.

const safe = (name) => name.replace(/[^A-Za-z0-9_]/g, "_");

const STREAMS = { TRANS: "#d06ba6", COMP_1: "#3b6fb6", COMP_2: "#2f9c95", COMP_3: "#a58fd6", UPDATE: "#e07b39" };

function render({ model, el }) {
  el.classList.add("rnb", "rnb-card", "rnb-graph");
  liveView(model, el);
  const controls = h("div", { class: "rnb-row" });
  const chips = h("div", { class: "rnb-row", style: { margin: "8px 0" } });
  const note = h("div");
  const canvas = h("div", { class: "rnb-graph-canvas" });
  const legend = h("div", { class: "rnb-legend" });
  el.append(h("div", { class: "rnb-title" }, "ComputationGraph"),
    h("div", { class: "rnb-sub" }, "Ops are boxes coloured by stream; tensors carry their name, id and the shape in the chosen variant's plan. "
      + "Click a layer's frame (or its chip) to fold it."),
    controls, chips, note, canvas, legend);

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
    for (const g of canvas.querySelectorAll("g[id^='layer_']")) {
      const layer = bySafe.get(g.id.slice(6));
      if (layer == null) continue;
      g.addEventListener("click", (ev) => { ev.stopPropagation(); toggle(layer); });
    }
    for (const th of canvas.querySelectorAll("th[data-layer]")) {
      th.style.cursor = "pointer";
      th.addEventListener("click", () => toggle(th.dataset.layer));
    }    const cuda = model.get("cuda");
    if (cuda) {  // the CUDA graph captured from this ComputationGraph (GPU backend), below it
      const box = h("div", { class: "rnb-cuda" }, h("div", { class: "rnb-sub" }, model.get("cuda_caption")));
      const body = h("div");
      body.innerHTML = cuda;
      box.append(body);
      canvas.append(box);
    }
  }

  const all = () => { drawControls(); drawChips(); drawCanvas(); };
  all();
  const on = [["change:view", all], ["change:graph", drawControls], ["change:gid", drawControls], ["change:variant", drawControls],
    ["change:layers", drawChips], ["change:collapsed", drawChips], ["change:svg", drawCanvas], ["change:table", drawCanvas],
    ["change:note", drawCanvas], ["change:cuda", drawCanvas]];
  for (const [e, f] of on) model.on(e, f);
  return () => { for (const [e, f] of on) model.off(e, f); };
}

export default { render };
