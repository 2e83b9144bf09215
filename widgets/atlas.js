// AtlasView: the GraphAtlas as a table of variants x GraphIds. Cells that share one bound
// graph share a colour (hover one to light up the others); a click opens that graph below.

// Every tensor each op reads and writes, the ranges swept by the optimizer, NaN check, clipping and EMA
// included: the drawing's dashed range boxes, spelled out name by name.
function accessTable(rows) {
  const names = (xs) => h("td", { class: "rnb-mono rnb-access-names" }, xs.length ? xs.join(", ") : "—");
  const table = h("table", { class: "rnb-table rnb-access" },
    h("tr", {}, h("th", {}, "op"), h("th", {}, "layer"), h("th", {}, "reads"), h("th", {}, "writes")),
    ...rows.map((r) => h("tr", { "data-op": r.op }, h("td", { class: "rnb-mono" }, h("b", {}, r.op)),
      h("td", {}, r.layer), names(r.reads), names(r.writes))));
  const total = rows.reduce((a, r) => a + r.reads.length + r.writes.length, 0);
  return h("details", { class: "rnb-access-list", open: rows.length <= 4 },
    h("summary", {}, `Every read and write: ${plural(rows.length, "op")}, ${plural(total, "access", "accesses")}`), table);
}

// One row per cell of the table: a variant's GraphId and the bound graph it runs.
function atlasRows(v) {
  if (!v.ready) return [];
  return v.variants.flatMap((name) => v.graph_ids.filter((g) => (v.cells[name] || {})[g]).map((g) => {
    const c = v.cells[name][g];
    return { variant: name, graph_id: g, stream: v.streams[g], captured: c.captured, graph: c.graph, shape_id: c.shape_id,
      shared_by: c.shared_by };
  }));
}

function render({ model, el }) {
  el.classList.add("rnb", "rnb-card", "rnb-atlas");
  liveView(model, el);

  function draw() {
    const v = model.get("view") || {};
    const sel = model.get("selected") || {};
    el.replaceChildren(h("div", { class: "rnb-title" }, "GraphAtlas"));
    if (!v.ready) {
      el.append(h("div", { class: "rnb-note" }, "No atlas yet: compile() fills it."));
      return;
    }
    const sids = Object.entries(v.shape_ids).map(([k, s]) => `s${k} = ${s}`).join(" · ");
    el.append(h("div", { class: "rnb-sub" },
      `${plural(v.entries, "entry", "entries")} over ${plural(v.variants.length, "variant")} → `, h("b", {}, plural(v.captures, "distinct bound graph")),
      `. Cells of one colour share one bound graph (grey: used by that cell only); hover a cell to see who shares it, click to open it. ShapeIds: ${sids}`));
    if (Object.keys(v.collapsed).length) {
      el.append(h("div", { class: "rnb-sub" }, "Collapsed onto the same captures (same input shape): "
        + Object.entries(v.collapsed).map(([a, b]) => `${a} → ${b}`).join(", ")));
    }
    const cellsByCapture = new Map();
    const table = h("table", { class: "rnb-atlas-table" });
    table.append(h("tr", {}, h("th", {}, "GraphId"), h("th", {}, "stream"),
      ...v.variants.map((name) => h("th", { class: "rnb-variant", title: v.unused.includes(name) ? "never runs for this data" : "" },
        name, v.unused.includes(name) ? h("div", { class: "rnb-muted", style: { fontWeight: 400 } }, "unused") : null))));
    for (const g of v.graph_ids) {
      const stream = v.streams[g];
      const row = h("tr", {}, h("th", { class: "rnb-mono" }, g),
        h("td", {}, h("span", { class: "rnb-pill", style: { background: v.stream_colors[stream], color: inkOn(v.stream_colors[stream]) } }, stream)));
      for (const name of v.variants) {
        const c = (v.cells[name] || {})[g];
        if (!c) { row.append(h("td", { class: "rnb-empty" }, "—")); continue; }
        const isSel = sel.variant === name && sel.gid === g;
        const td = h("td", {
          class: "rnb-cell" + (isSel ? " rnb-selected" : ""), "data-captured": c.captured, "data-variant": name, "data-gid": g,
          style: { background: c.color, color: c.ink },
          title: `${name} · ${g} → bound graph #${c.captured} (${c.graph}, ShapeId s${c.shape_id}, stream ${c.stream}); shared by ${plural(c.shared_by, "entry", "entries")}`,
          onmouseenter: () => { for (const x of cellsByCapture.get(c.captured)) x.classList.add("rnb-hi"); },
          onmouseleave: () => { for (const x of cellsByCapture.get(c.captured)) x.classList.remove("rnb-hi"); },
          onclick: () => { model.set("selected", { variant: name, gid: g }); model.save_changes(); },
        }, h("span", { class: "rnb-cap" }, `#${c.captured}`), h("span", { class: "rnb-sid" }, `s${c.shape_id}`),
          c.shared_by > 1 ? h("span", { class: "rnb-shared" }, `×${c.shared_by}`) : null);
        if (!cellsByCapture.has(c.captured)) cellsByCapture.set(c.captured, []);
        cellsByCapture.get(c.captured).push(td);
        row.append(td);
      }
      table.append(row);
    }
    el.append(h("div", { style: { overflowX: "auto" } }, table));
    el.append(h("div", { class: "rnb-legend" },
      h("span", {}, h("b", {}, "#n"), " captured index"), h("span", {}, h("b", {}, "sK"), " ShapeId (s0: any shape)"),
      h("span", {}, h("b", {}, "×m"), " entries sharing that bound graph")),
      h("div", { class: "rnb-legend rnb-share-legend" }, h("span", { class: "rnb-muted" }, "shared by:"),
        ...(v.patterns || []).map((p) => h("span", { "data-pattern": p.variants.join(" ") },
          h("span", { class: "rnb-swatch", style: { background: p.color, outline: `1px solid ${p.ink}` } }), p.variants.join(" = "))),
        h("span", {}, h("span", { class: "rnb-swatch", style: { background: "var(--rnb-panel)", outline: "1px solid var(--rnb-muted)" } }), "this cell only")));

    const d = model.get("detail") || {};
    const detail = h("div", { class: "rnb-detail rnb-atlas-detail", "data-captured": d.captured ?? "" });
    if (d.gid) {
      detail.append(h("div", { class: "rnb-row" },
        h("span", { class: "rnb-pill", style: { background: d.ink, color: inkOn(d.ink) } }, `#${d.captured}`),
        h("b", { class: "rnb-mono" }, `${d.graph} / ${d.gid}`),
        h("span", { class: "rnb-muted" }, `in ${d.variant} · ShapeId s${d.shape_id} = ${d.shape} · stream ${d.stream} · ${plural(d.n_nodes, "node")}`),
        h("span", { class: "rnb-grow" }),
        h("button", { class: "rnb-btn rnb-quiet", onclick: () => { model.set("selected", {}); model.save_changes(); } }, "close")));
      detail.append(h("div", { class: "rnb-sub" }, d.shared_with.length
        ? `The same bound graph also serves: ${d.shared_with.join(", ")}.`
        : "Only this cell uses this bound graph."));
      if (d.note) detail.append(h("div", { class: "rnb-note" }, d.note));
      const canvas = h("div", { class: "rnb-graph-canvas" });
      canvas.innerHTML = d.svg || d.table || "";
      detail.append(canvas);
      if ((d.access || []).length) detail.append(accessTable(d.access));
    } else {
      detail.append(h("span", { class: "rnb-muted" }, "Click a cell to open its graph, drawn with the shapes of that variant."));
    }
    el.append(detail);
  }
  draw();
  exportBar(el, { name: "atlas", picture: () => el.querySelector(".rnb-atlas-table"), rows: () => atlasRows(model.get("view") || {}),
    data: () => { const v = model.get("view") || {}; return v.ready ? { entries: v.entries, captures: v.captures,
      variants: v.variants, graph_ids: v.graph_ids, streams: v.streams, shape_ids: v.shape_ids, unused: v.unused,
      cells: atlasRows(v) } : { ready: false }; } });
  const events = ["change:view", "change:selected", "change:detail"];
  for (const e of events) model.on(e, draw);
  return () => { for (const e of events) model.off(e, draw); };
}

export default { render };
