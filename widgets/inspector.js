// MemoryInspectorView: a step scrubber over the step's nodes (the running op, what it reads and writes,
// the live tensors on the arena, live bytes so far), the tensors live at the peak of each variant, what-if
// plans side by side with the current one, the largest batch that fits a budget, and a tensor inspector.
// Python answers every question (display/inspector_view.py); this module draws and sends the picks.
// Each section is drawn once per view; a pick restyles what it changes (a tick: the strips' live, read and
// written marks and the curve's marker; a selected tensor: its highlight). One click listener serves every
// tensor drawn (chips, strip boxes, table rows).

const signed = (n) => (n === 0 ? "0" : (n > 0 ? "+" : "−") + human(Math.abs(n)));
const SW = 760;  // width of the drawings, in SVG units (they scale to the card)
const PICKABLE = ".rnb-insp-chip, .rnb-insp-box, .rnb-insp-pick";  // a click on one inspects its data-tensor

// toPrecision without the zeros that end a fraction ("0.5000" -> "0.5", "1.000e-7" -> "1e-7"); an integer's
// own zeros stay ("1000" is 1000, not 1).
function num(x, p = 6) {
  if (x == null) return "—";
  const [m, e] = Number(x).toPrecision(p).split("e");
  const mant = m.includes(".") ? m.replace(/\.?0+$/, "") : m;
  return e === undefined ? mant : `${mant}e${e}`;
}

function isLive(t, time) {  // the engine's rule (inspector_data.live_ids): state all step, the rest by interval
  return t.intervals === null || t.intervals.some(([a, b]) => a <= time && time <= b);
}

// ---- what one rendering shares ------------------------------------------------------------------------
function makeUi(model, el) {
  const ui = { model, el, v: {}, byId: new Map(), times: [], box: {}, showAll: false, strips: [], curve: null };
  ui.save = (key, value) => { model.set(key, value); model.save_changes(); };
  ui.pick = (name) => ui.save("selected", name);
  ui.variant = () => (ui.v.variants.includes(model.get("variant")) ? model.get("variant") : ui.v.variants[0]);
  ui.vIndex = () => ui.v.variants.indexOf(ui.variant());
  ui.tickIndex = () => Math.max(0, ui.times.indexOf(model.get("tick")));
  return ui;
}

function chips(ui, ids, cls, most = 28) {
  const sel = ui.model.get("selected");
  const out = ids.slice(0, most).map((id) => {
    const t = ui.byId.get(id);
    return h("span", { class: `rnb-tensor rnb-insp-chip ${cls}` + (t.name === sel ? " rnb-picked" : ""),
      "data-tensor": t.name, style: { borderColor: t.color }, title: `${t.region} · ${t.shape} · click to inspect` }, t.name);
  });
  if (ids.length > most) out.push(h("span", { class: "rnb-muted" }, ` … ${ids.length - most} more`));
  return out.length ? out : [h("span", { class: "rnb-muted" }, "nothing")];
}

function markPicked(ui) {  // the selected tensor outlined wherever it is drawn
  for (const e of ui.el.querySelectorAll(".rnb-picked")) e.classList.remove("rnb-picked");
  const name = ui.model.get("selected");
  if (!name) return;
  for (const e of ui.el.querySelectorAll(`[data-tensor="${CSS.escape(name)}"]`)) if (e.matches(PICKABLE)) e.classList.add("rnb-picked");
}

// ---- the step scrubber ---------------------------------------------------------------------------------
function scrubberSection(ui) {
  const { box, v } = ui;
  const step = (by) => stepBy(ui, by);
  box.slider = h("input", { type: "range", class: "rnb-insp-slider", min: 0, max: ui.times.length - 1, step: 1,
    value: ui.tickIndex(), "aria-label": "step scrubber: node of the step",
    oninput: (e) => ui.model.set("tick", ui.times[+e.target.value]),  // drawn at once, sent on release
    onchange: (e) => ui.save("tick", ui.times[+e.target.value]) });  // its keys: scrubKeys, one node each
  box.tickInfo = h("div", { class: "rnb-insp-op" });
  box.rw = h("div", { class: "rnb-insp-rw-box" });
  box.curve = h("div", { class: "rnb-insp-curve-box" });
  const [lo, hi] = v.focus_range;
  ui.strips = [strip(ui, 0, v.arena_bytes, "rnb-insp-arena"), strip(ui, lo, hi, "rnb-insp-focus")];
  drawCurve(ui);
  return h("div", { class: "rnb-insp-section rnb-insp-scrubber", tabindex: 0 },
    h("div", { class: "rnb-h" }, "Step scrubber · drag, or focus and use ← →"),
    h("div", { class: "rnb-row" },
      h("button", { class: "rnb-btn rnb-insp-prev", title: "previous node", onclick: () => step(-1) }, "◀"),
      box.slider,
      h("button", { class: "rnb-btn rnb-insp-next", title: "next node", onclick: () => step(1) }, "▶"),
      h("button", { class: "rnb-btn rnb-quiet rnb-insp-to-peak", onclick: () => ui.save("tick", v.peaks[ui.variant()].time) },
        "go to the peak")),
    box.tickInfo, box.rw,
    h("div", { class: "rnb-insp-strips" },
      h("div", { class: "rnb-sub" }, `The arena (${v.arena_human}): live tensors coloured by region family; read here: white dashed, written: black · click one to inspect it`),
      ui.strips[0].svg,
      h("div", { class: "rnb-sub" }, `Feature maps and temporaries: offsets ${humanAxis(lo, hi, hi - lo)}–${humanAxis(hi, hi, hi - lo)} of the arena`),
      ui.strips[1].svg),
    box.curve);
}

const stepBy = (ui, by) => ui.save("tick", ui.times[Math.min(ui.times.length - 1, Math.max(0, ui.tickIndex() + by))]);

// ← → a node, Home and End the step's ends, while the scrubber (or its slider) has the focus; true when
// the key was the scrubber's (the view's key handler, dom.js keyboard, then does nothing more).
function scrubKeys(ui, e) {
  const by = { ArrowLeft: -1, ArrowRight: 1, Home: -1e9, End: 1e9 }[e.key];
  if (by === undefined || !ui.box.slider || !(e.target.closest && e.target.closest(".rnb-insp-scrubber"))) return false;
  e.preventDefault();
  stepBy(ui, by);
  return true;
}

// The arena from lo to hi: one box per tensor, drawn once per view; styleStrip marks a tick's live, read and
// written ones, and a box's tooltip is written when the pointer reaches it.
function strip(ui, lo, hi, cls) {
  const span = Math.max(hi - lo, 1), H = 30, rects = [];
  const svg = s("svg", { viewBox: `0 0 ${SW} ${H + 14}`, class: `rnb-insp-strip ${cls}` });
  svg.append(s("rect", { x: 0, y: 0, width: SW, height: H, rx: 5, fill: "#f2f4f7", class: "rnb-svg-panel" }));
  for (const t of ui.v.tensors) {
    if (!t.slot_bytes || t.offset + t.slot_bytes <= lo || t.offset >= hi) continue;
    const a = Math.max(t.offset, lo), b = Math.min(t.offset + t.slot_bytes, hi);
    const r = s("rect", { x: ((a - lo) / span) * SW, y: 2, width: Math.max(((b - a) / span) * SW, 1), height: H - 4,
      fill: t.color, class: "rnb-insp-box", "stroke-width": 1.4, "data-tensor": t.name });
    r.append(s("title", {}, t.name));
    svg.append(r);
    rects.push([t, r]);
  }
  svg.append(s("text", { x: 0, y: H + 12, "font-size": 12, fill: "#667085", class: "rnb-svg-ax" }, humanAxis(lo, hi, hi - lo)),
    s("text", { x: SW, y: H + 12, "font-size": 12, fill: "#667085", class: "rnb-svg-ax", "text-anchor": "end" }, humanAxis(hi, hi, hi - lo)));
  const of = new Map(rects.map(([t, r]) => [r, t]));
  svg.addEventListener("mouseover", (e) => {
    const t = of.get(e.target);
    if (!t) return;
    const tick = ui.v.ticks[ui.tickIndex()], rd = tick.reads.includes(t.id), wr = tick.writes.includes(t.id);
    e.target.firstChild.textContent = `${t.name} · ${t.region} · offset ${t.offset.toLocaleString()} · `
      + human(t.storage[ui.vIndex()]) + (isLive(t, tick.t) ? " · live" : "") + (wr ? " · written here" : rd ? " · read here" : "");
  });
  return { svg, rects, marks: new Int8Array(rects.length).fill(-1) };
}

function styleStrip(st, tick) {  // only the boxes whose marks change are touched
  const reads = new Set(tick.reads), writes = new Set(tick.writes);
  st.rects.forEach(([t, r], i) => {
    const on = isLive(t, tick.t), rd = reads.has(t.id), wr = writes.has(t.id), mark = (on ? 1 : 0) + (rd ? 2 : 0) + (wr ? 4 : 0);
    if (st.marks[i] === mark) return;
    st.marks[i] = mark;
    r.setAttribute("fill-opacity", on ? 1 : 0.12);
    r.setAttribute("stroke", wr ? "#1f2328" : rd ? "#ffffff" : "none");
    r.setAttribute("stroke-dasharray", rd && !wr ? "3 2" : "none");
    r.setAttribute("data-live", on ? 1 : 0);
  });
}

// Live bytes over the step in the shown variant, drawn once per view and variant, with a y axis in bytes and
// the peak marked (a red dot, its line and its value, drawn above the rest); mark(at) moves the scrubber's
// line and dot and fills the step so far.
function drawCurve(ui) {
  const c = ui.v.curves[ui.variant()], H = 120, L = 70, n = Math.max(c.length - 1, 1), top = Math.max(...c, 1);
  const X = (t) => L + (t / n) * (SW - L - 4), Y = (b) => 8 + (1 - b / top) * (H - 8);
  const pts = c.map((b, i) => `${X(i).toFixed(1)},${Y(b).toFixed(1)}`);
  const svg = s("svg", { viewBox: `0 0 ${SW} ${H + 18}`, class: "rnb-insp-curve" });
  for (const p of programs(ui.v.ticks)) svg.append(s("rect", { x: X(p.start), y: 8, width: Math.max(X(p.end) - X(p.start), 1), height: H - 8, fill: "#f6f8fa", class: "rnb-svg-panel" }));
  for (const k of [0, 0.5, 1]) {  // the y axis: none, half and all of the peak
    svg.append(s("line", { x1: L - 4, x2: SW - 4, y1: Y(top * k), y2: Y(top * k), stroke: "#eef0f3", class: "rnb-svg-grid" }),
      s("text", { x: L - 8, y: Y(top * k) + 4, "font-size": 12, fill: "#667085", class: "rnb-svg-ax rnb-insp-yaxis", "text-anchor": "end",
        "data-bytes": Math.round(top * k) }, humanAxis(top * k, top, top / 2)));
  }
  const sofar = s("polygon", { fill: "#3b6fb6", "fill-opacity": 0.15 });
  const pk = ui.v.peaks[ui.variant()].time;
  const line = s("line", { y1: 8, y2: H, stroke: "#1f2328", "stroke-width": 1.6, class: "rnb-insp-marker rnb-svg-marker" });
  const dot = s("circle", { r: 3.5, fill: "#1f2328", class: "rnb-svg-dot" });
  const right = X(pk) > SW * 0.7;  // the peak's label on the side with room
  svg.append(s("polyline", { points: pts.join(" "), fill: "none", stroke: "#3b6fb6", "stroke-width": 1.4 }), sofar, line, dot,
    s("line", { x1: X(pk), x2: X(pk), y1: 8, y2: H, stroke: "#c2334d", "stroke-dasharray": "4 3", "stroke-width": 1.4 }),
    s("circle", { cx: X(pk), cy: Y(c[pk] || top), r: 4.5, fill: "#c2334d", class: "rnb-insp-peak-dot" }),
    s("text", { x: X(pk) + (right ? -8 : 8), y: 20, "font-size": 12, fill: "#c2334d", "font-weight": 600, "text-anchor": right ? "end" : "start",
      class: "rnb-insp-peak-label" }, `peak ${human(top)} at tick ${pk}`),
    s("text", { x: L, y: H + 15, "font-size": 12, fill: "#667085", class: "rnb-svg-ax" }, `tick ${ui.times[0]}`),
    s("text", { x: SW - 4, y: H + 15, "font-size": 12, fill: "#667085", class: "rnb-svg-ax", "text-anchor": "end" }, `live bytes (${ui.variant()}) · tick ${ui.times[ui.times.length - 1]}`));
  ui.box.curve.replaceChildren(svg);
  ui.curve = (at) => {
    sofar.setAttribute("points", `${X(0)},${H} ` + pts.slice(0, at + 1).join(" ") + ` ${X(at)},${H}`);
    for (const [k, x] of [["x1", X(at)], ["x2", X(at)], ["data-tick", at]]) line.setAttribute(k, x);
    dot.setAttribute("cx", X(at));
    dot.setAttribute("cy", Y(c[at] || 0));
  };
}

function programs(ticks) {
  const out = [];
  for (const k of ticks) {
    const last = out[out.length - 1];
    if (last && last.name === k.program) last.end = k.t; else out.push({ name: k.program, start: k.t, end: k.t });
  }
  return out;
}

function updateScrub(ui) {
  const { box, v } = ui, i = ui.tickIndex(), tick = v.ticks[i], live = v.curves[ui.variant()][tick.t] || 0;
  if (+box.slider.value !== i) box.slider.value = i;
  box.slider.setAttribute("aria-valuetext", `tick ${tick.t}`);  // one counter: the tick, never the slider's index
  const ranges = [...tick.ranges_read.map((r) => `reads ${r}`), ...tick.ranges_written.map((r) => `writes ${r}`)];
  box.tickInfo.replaceChildren(
    h("div", { class: "rnb-row" },
      h("span", { class: "rnb-pill", style: { background: "#3b6fb6" }, "data-tick": tick.t }, `tick ${tick.t}`),
      h("span", { class: "rnb-muted" }, `of ${ui.times[0]}–${ui.times[ui.times.length - 1]} · ${tick.program}`),
      h("b", { class: "rnb-mono rnb-insp-opname", "data-op": tick.op }, tick.op),
      h("span", {}, h("span", { class: "rnb-muted" }, "layer "), h("span", { class: "rnb-insp-layer" }, tick.layer || "-")),
      h("span", {}, h("span", { class: "rnb-muted" }, "GraphId "), h("span", { class: "rnb-mono rnb-insp-gid" }, tick.gid)),
      h("span", { class: "rnb-grow" }),
      h("span", { class: "rnb-stat" }, h("b", { class: "rnb-insp-live", "data-bytes": live }, human(live)), h("span", {}, `live (${ui.variant()})`))),
    ranges.length ? h("div", { class: "rnb-muted rnb-insp-ranges" }, "region-wide: " + ranges.join("; ")) : "");
  box.rw.replaceChildren(
    h("div", { class: "rnb-insp-rw rnb-insp-reads", "data-count": tick.reads.length }, h("span", { class: "rnb-k" }, `reads ${tick.reads.length}`), ...chips(ui, tick.reads, "rnb-read")),
    h("div", { class: "rnb-insp-rw rnb-insp-writes", "data-count": tick.writes.length }, h("span", { class: "rnb-k" }, `writes ${tick.writes.length}`), ...chips(ui, tick.writes, "rnb-write")));
  for (const st of ui.strips) styleStrip(st, tick);
  ui.curve(tick.t);
}

// ---- live at the peak ----------------------------------------------------------------------------------
function stack(ui, rows, total, cls) {
  const colours = Object.fromEntries(ui.v.categories.map((c) => [c.category, c.color]));
  const bar = h("div", { class: `rnb-insp-stack ${cls}` });
  for (const r of rows) {
    if (!r.bytes) continue;
    bar.append(h("div", { class: "rnb-insp-stack-seg", "data-category": r.category, "data-bytes": r.bytes,
      title: `${r.category}: ${human(r.bytes)}`, style: { width: `${(r.bytes / Math.max(total, 1)) * 100}%`, background: colours[r.category] } }));
  }
  return bar;
}
function legend(ui, rows) {
  const colours = Object.fromEntries(ui.v.categories.map((c) => [c.category, c.color]));
  return h("div", { class: "rnb-legend" }, ...rows.filter((r) => r.bytes).map((r) =>
    h("span", { "data-category": r.category }, h("span", { class: "rnb-swatch", style: { background: colours[r.category] } }), h("b", {}, r.category), ` ${human(r.bytes)}`)));
}

function updatePeak(ui) {
  const name = ui.variant(), p = ui.v.peaks[name], sel = ui.model.get("selected");
  const seg = h("div", { class: "rnb-seg rnb-insp-variants" }, ...ui.v.variants.map((x) =>
    h("button", { class: x === name ? "rnb-on" : "", "data-variant": x, onclick: () => ui.save("variant", x) }, x)));
  const table = h("table", { class: "rnb-table rnb-insp-peak-table" }, h("tr", {},
    ...["tensor", "category", "bytes", "written by", "layer"].map((c, i) => h("th", { class: i === 2 ? "rnb-num" : "" }, c))));
  for (const [id, n] of ui.showAll ? p.tensors : p.tensors.slice(0, 20)) {
    const t = ui.byId.get(id);
    table.append(h("tr", { "data-tensor": t.name, class: "rnb-insp-pick" + (t.name === sel ? " rnb-picked" : "") },
      h("td", { class: "rnb-mono" }, h("span", { class: "rnb-swatch", style: { background: t.color } }), t.name),
      h("td", {}, t.category), h("td", { class: "rnb-num", "data-bytes": n }, human(n)),
      h("td", { class: "rnb-mono" }, t.producer), h("td", {}, t.layer || "-")));
  }
  const more = p.tensors.length > 20 ? h("button", { class: "rnb-btn rnb-quiet", onclick: () => { ui.showAll = !ui.showAll; updatePeak(ui); } },
    ui.showAll ? "show the 20 largest" : `show all ${p.tensors.length}`) : "";
  ui.box.peak.replaceChildren(
    h("div", { class: "rnb-h" }, "Live at the peak"),
    h("div", { class: "rnb-row" }, h("span", { class: "rnb-muted" }, "variant"), seg),
    h("div", { class: "rnb-row", style: { margin: "8px 0" } },
      h("span", { class: "rnb-stat" }, h("b", { class: "rnb-insp-peak-bytes", "data-bytes": p.bytes }, p.human), h("span", {}, `peak of a ${human(p.arena)} arena`)),
      h("span", { class: "rnb-grow rnb-muted" }, `at tick ${p.time}: ${p.op} (${p.layer || "-"}) in ${p.program} · ${p.tensors.length} tensors live`),
      h("button", { class: "rnb-btn", onclick: () => ui.save("tick", p.time) }, "scrub to it")),
    stack(ui, p.by_category, p.bytes, "rnb-insp-peak-stack"), legend(ui, p.by_category), table, more);
}

// ---- what-if -------------------------------------------------------------------------------------------
function ask(ui, key, value) {
  const next = { ...(ui.model.get("what_if") || {}), [key]: value };
  if (JSON.stringify(value) === JSON.stringify(ui.v.settings[key])) delete next[key];  // back to the current value
  ui.save("what_if", next);
}

function controls(ui) {
  const st = ui.v.settings, a = { ...st, ...(ui.model.get("what_if") || {}) };
  const out = h("div", { class: "rnb-row rnb-insp-controls" });
  out.append(h("label", {}, "batch ", h("input", { type: "number", min: 1, class: "rnb-insp-batch", value: a.batch_size,
    onchange: (e) => ask(ui, "batch_size", parseInt(e.target.value, 10)) })));
  if (st.image) {
    const res = (i) => h("input", { type: "number", min: 1, class: `rnb-insp-res rnb-insp-res-${i}`, value: a.resolution[i],
      onchange: () => ask(ui, "resolution", [0, 1].map((k) => parseInt(out.querySelector(`.rnb-insp-res-${k}`).value, 10))) });
    out.append(h("label", {}, "resolution ", res(0), " × ", res(1)));
  }
  for (const [key, label] of [["liveness", "liveness reuse"], ["pad_rows", "row padding"], ["fuse", "fusion"], ["ema", "EMA"]]) {
    out.append(h("label", { class: "rnb-insp-toggle" }, h("input", { type: "checkbox", "data-setting": key, checked: !!a[key],
      onchange: (e) => ask(ui, key, e.target.checked) }), ` ${label}`));
  }
  const sel = h("select", { class: "rnb-select rnb-insp-optimizer", onchange: (e) => ask(ui, "optimizer", e.target.value) },
    ...ui.v.optimizers.map((o) => h("option", { value: o.value, selected: o.value === a.optimizer }, o.label)));
  out.append(h("label", {}, "optimizer ", sel),
    h("button", { class: "rnb-btn rnb-quiet rnb-insp-reset", onclick: () => ui.save("what_if", {}) }, "as now"));
  return out;
}

function side(ui, r, k) {
  const total = Math.max(...r.arena, 1), rows = r.categories.map((c) => ({ category: c.category, bytes: k ? c.b : c.a }));
  return h("div", { class: `rnb-insp-side rnb-insp-side-${k ? "whatif" : "current"}` },
    h("div", {}, h("b", {}, k ? `what-if: ${r.labels[k]}` : "now")),
    h("div", { class: "rnb-row", style: { margin: "4px 0" } },
      h("span", { class: "rnb-stat" }, h("b", { class: "rnb-insp-arena-bytes", "data-bytes": r.arena[k] }, r.arena_human[k]), h("span", {}, "arena")),
      h("span", { class: "rnb-stat" }, h("b", { class: "rnb-insp-peak-whatif", "data-bytes": r.peak[k] }, r.peak_human[k]), h("span", {}, `peak (${r.variant})`))),
    h("div", { style: { width: `${(r.arena[k] / total) * 100}%` } }, stack(ui, rows, r.arena[k], "")), legend(ui, rows));
}

function diffTable(rows, key, head) {  // rows of tensors ("name") are picked by the widget's click listener
  const t = h("table", { class: `rnb-table rnb-insp-diff-${key}` }, h("tr", {}, h("th", {}, head), h("th", { class: "rnb-num" }, "now"),
    h("th", { class: "rnb-num" }, "what-if"), h("th", { class: "rnb-num" }, "change")));
  for (const x of rows) {
    const name = x[key], tensor = key === "name";
    t.append(h("tr", { "data-name": name, "data-tensor": tensor ? name : null, class: tensor ? "rnb-insp-pick" : "" },
      h("td", { class: "rnb-mono" }, name), h("td", { class: "rnb-num", "data-bytes": x.a }, human(x.a)),
      h("td", { class: "rnb-num", "data-bytes": x.b }, human(x.b)), h("td", { class: "rnb-num" }, signed(x.change))));
  }
  return t;
}

function movedTable(r) {
  const t = h("table", { class: "rnb-table rnb-insp-moved" }, h("tr", {}, h("th", {}, "tensor"), h("th", { class: "rnb-num" }, "offset now"), h("th", { class: "rnb-num" }, "what-if")));
  for (const m of r.moved.slice(0, 40)) {
    t.append(h("tr", { "data-tensor": m.name, class: "rnb-insp-pick" }, h("td", { class: "rnb-mono" }, m.name),
      h("td", { class: "rnb-num rnb-mono" }, m.a.toLocaleString()), h("td", { class: "rnb-num rnb-mono" }, m.b.toLocaleString())));
  }
  return t;
}

function updateWhatif(ui) {
  const r = ui.model.get("whatif_result") || {}, out = [];
  if (r.error) out.push(h("div", { class: "rnb-error rnb-insp-whatif-error" }, r.error));
  else if (!r.summary) out.push(h("div", { class: "rnb-muted" }, "Change a setting above: the plan is made again (planning only, no kernels) and set beside this one."));
  else {
    out.push(h("div", { class: "rnb-note rnb-whatif-summary" }, r.summary),
      h("div", { class: "rnb-insp-sides" }, side(ui, r, 0), side(ui, r, 1)),
      h("div", { class: "rnb-h" }, `By category (${r.variant})`),
      diffTable(r.categories.filter((c) => c.a || c.b), "category", "category"));
    if (r.grew.length || r.shrank.length) out.push(h("div", { class: "rnb-h" }, `Regions that grew (${r.grew.length}) or shrank (${r.shrank.length})`), diffTable([...r.grew, ...r.shrank], "region", "region"));
    if (r.n_moved) out.push(h("div", { class: "rnb-h" }, `Tensors that moved (${r.n_moved})` + (r.n_moved > 40 ? ", the first 40" : "")), movedTable(r));
    if (r.resized.length) out.push(h("div", { class: "rnb-h" }, `Tensors resized (${r.resized.length})`), diffTable(r.resized.slice(0, 40), "name", "tensor"));
    if (r.added.length || r.removed.length) out.push(h("div", { class: "rnb-muted" }, (r.added.length ? `added: ${r.added.join(", ")} ` : "") + (r.removed.length ? `removed: ${r.removed.join(", ")}` : "")));
  }
  ui.box.whatifResult.replaceChildren(...out);
  const f = ui.model.get("fit_result") || {};
  ui.box.fitAnswer.replaceChildren(f.error ? h("span", { class: "rnb-error" }, f.error) : f.batch == null ? "" :
    h("span", { "data-batch": f.batch }, `Largest batch that fits in ${f.budget_human} (${f.settings}): `, h("b", { class: "rnb-insp-fit-batch" }, f.batch),
      `, arena ${f.arena_human}` + (f.next_human ? `; batch ${f.batch + 1} would need ${f.next_human}` : ` (the whole training set: ${f.limit})`)));
}

function whatifSection(ui) {
  const { box, model, v } = ui;
  box.controls = h("div", {}, controls(ui));
  box.whatifResult = h("div", { class: "rnb-insp-whatif-result" });
  box.fitAnswer = h("div", { class: "rnb-insp-fit" });
  const budget = model.get("fit_budget");
  const mib = h("input", { type: "number", min: 0.01, step: "any", class: "rnb-insp-budget", value: budget ? budget / 2 ** 20 : Math.ceil(2 * v.arena_bytes / 2 ** 20) });
  const go = () => {  // a budget Python's Int takes: a whole number of bytes, at least 1, that a double holds exactly
    const bytes = Math.round(Number(mib.value) * 2 ** 20);
    if (mib.value.trim() === "" || !Number.isSafeInteger(bytes) || bytes < 1) {
      box.fitAnswer.replaceChildren(h("span", { class: "rnb-error rnb-insp-budget-error" },
        `The budget must be a number of MiB above 0 (got ${mib.value.trim() === "" ? "an empty field" : `"${mib.value}"`}): nothing was asked.`));
      return;
    }
    ui.save("fit_budget", bytes);
    updateWhatif(ui);  // the same budget again changes nothing in Python: its answer shown again
  };
  mib.addEventListener("change", go);  // Enter (dom.js keyboard) or leaving the field
  return h("div", { class: "rnb-insp-section rnb-insp-whatif" }, h("div", { class: "rnb-h" }, "What-if"), box.controls, box.whatifResult,
    h("div", { class: "rnb-row rnb-insp-fit-row" }, "Largest batch that fits in", mib, "MiB",
      h("button", { class: "rnb-btn rnb-insp-fit-btn", onclick: go }, "find"), box.fitAnswer));
}

// ---- the tensor inspector ------------------------------------------------------------------------------
function histogram(st) {
  const W = 360, H = 80, top = Math.max(...st.counts, 1), bw = W / st.counts.length;
  const svg = s("svg", { viewBox: `0 0 ${W} ${H + 14}`, class: "rnb-insp-hist" });
  st.counts.forEach((c, i) => {
    const r = s("rect", { x: i * bw, y: H - (c / top) * H, width: Math.max(bw - 1, 0.5), height: (c / top) * H, fill: "#3b6fb6", "data-count": c });
    r.append(s("title", {}, `[${num(st.edges[i], 4)}, ${num(st.edges[i + 1], 4)}): ${c}`));
    svg.append(r);
  });
  const last = st.edges[st.edges.length - 1];
  svg.append(s("text", { x: 0, y: H + 12, "font-size": 12, fill: "#667085", class: "rnb-svg-ax rnb-insp-edge-lo", "data-value": st.edges[0] }, num(st.edges[0], 4)),
    s("text", { x: W, y: H + 12, "font-size": 12, fill: "#667085", "text-anchor": "end", class: "rnb-svg-ax rnb-insp-edge-hi", "data-value": last }, num(last, 4)));
  return svg;
}

function stat(label, value, cls) {
  const text = Number.isInteger(value) ? value.toLocaleString() : num(value, 5);
  return h("span", { class: `rnb-stat ${cls}`, "data-value": value == null ? "" : String(value) }, h("b", {}, text), h("span", {}, label));
}

function sizes(ui, storage) {  // the bytes each variant uses, variants of one size together
  const groups = new Map();
  storage.forEach((n, i) => groups.set(n, [...(groups.get(n) || []), ui.v.variants[i]]));
  if (groups.size === 1) return `${human(storage[0])} used in every variant`;
  return [...groups].map(([n, names]) => `${human(n)} in ${names.join(", ")}`).join("; ");
}

function updateRow(u) {  // G as the update used it: after clipping, when it is set, with the norms before
  const clipped = u.clip_factor != null;
  const out = [stat(`gradient norm${clipped ? " after clipping" : ""} (step ${u.step})`, u.grad_norm, "rnb-insp-gnorm")];
  if (clipped) {
    out.push(stat(`before clipping (×${num(u.clip_factor, 4)}; all gradients ${num(u.clip_norm, 4)})`,
      u.grad_norm != null && u.clip_factor ? u.grad_norm / u.clip_factor : null, "rnb-insp-gnorm-before"));
  }
  out.push(stat("|W|", u.weight_norm, "rnb-insp-wnorm"), stat("|dW|", u.update_norm, "rnb-insp-dnorm"),
    stat("update ratio |dW|/|W|", u.ratio, "rnb-insp-ratio"), h("span", { class: "rnb-muted rnb-grow rnb-insp-how" }, `lr ${num(u.lr, 4)} · ${u.how}`));
  return h("div", { class: "rnb-row rnb-insp-update" }, ...out);
}

function updateTensor(ui) {
  const t = ui.model.get("tensor") || {}, head = h("div", { class: "rnb-h" }, "Tensor inspector");
  if (!t.name) { ui.box.tensor.replaceChildren(head, h("div", { class: "rnb-muted" }, "Click any tensor (in the arena strips, the peak table, the what-if tables or a chip) to see it here.")); return; }
  if (t.error) { ui.box.tensor.replaceChildren(head, h("div", { class: "rnb-error" }, t.error)); return; }
  const live = t.intervals === null ? "the whole step (state)" : t.intervals.map(([a, b]) => `ticks ${a}–${b}`).join(", ") || "never";
  const rows = [["shape", `${t.shape} ${t.dtype}`], ["region", `${t.region} (${t.category})`], ["offset", `${t.offset.toLocaleString()} (0x${t.offset.toString(16)})`],
    ["bytes", `${t.slot_bytes.toLocaleString()}-byte slot · ` + sizes(ui, t.storage)],
    ["live", live], ["written by", `${t.producer} (${t.layer || "-"}) · written at ${t.writes_at.length}, read at ${t.reads_at.length} ticks`]];
  const out = [head,
    h("div", { class: "rnb-row" }, h("span", { class: "rnb-swatch", style: { background: t.color } }), h("b", { class: "rnb-mono rnb-insp-tensor-name" }, t.name),
      h("span", { class: "rnb-grow" }), h("button", { class: "rnb-btn rnb-quiet", onclick: () => ui.pick("") }, "close")),
    h("table", { class: "rnb-table rnb-insp-tensor-table" }, ...rows.map(([k, x]) => h("tr", {}, h("th", {}, k), h("td", { class: "rnb-mono" }, x))))];
  const st = t.stats;
  if (st) {
    out.push(h("div", { class: "rnb-row rnb-insp-values" }, st.counts.length ? histogram(st) : h("span", { class: "rnb-muted" }, "no finite value"),
      h("div", { class: "rnb-row rnb-insp-stats" }, stat("min", st.min, "rnb-insp-min"), stat("max", st.max, "rnb-insp-max"), stat("mean", st.mean, "rnb-insp-mean"),
        stat("std", st.std, "rnb-insp-std"), stat("NaN", st.nan, "rnb-insp-nan"), stat("Inf", st.inf, "rnb-insp-inf"), stat("values", st.size, "rnb-insp-size"))));
    if (st.update) out.push(updateRow(st.update));
  }
  if (t.note) out.push(h("div", { class: "rnb-muted rnb-insp-note" }, t.note));
  ui.box.tensor.replaceChildren(...out);
}

// ---- the whole widget ----------------------------------------------------------------------------------
function draw(ui) {
  const { el, box } = ui, v = (ui.v = ui.model.get("view") || {});
  el.replaceChildren();
  if (!v.ready || !v.ticks.length) {
    el.append(h("div", { class: "rnb-title" }, "Memory inspector"), h("div", { class: "rnb-note" }, v.reason || "The plan has no nodes to scrub."));
    box.slider = null;
    return;
  }
  ui.byId = new Map(v.tensors.map((t) => [t.id, t]));
  ui.times = v.ticks.map((k) => k.t);
  box.peak = h("div", { class: "rnb-insp-section rnb-insp-peak" });
  box.tensor = h("div", { class: "rnb-insp-section rnb-insp-tensor" });
  el.append(h("div", { class: "rnb-row" }, h("div", { class: "rnb-grow" }, h("div", { class: "rnb-title" }, "Memory inspector"),
    h("div", { class: "rnb-sub" }, `${ui.times.length} nodes in the step · ${v.tensors.length} tensors · phase ${v.phase}` + (v.compiled ? "" : " · values after compile()"))),
  h("span", { class: "rnb-stat" }, h("b", {}, v.arena_human), h("span", {}, "arena"))),
  scrubberSection(ui), box.peak, whatifSection(ui), box.tensor);
  updateScrub(ui); updatePeak(ui); updateWhatif(ui); updateTensor(ui); markPicked(ui);
}

// The export buttons' data: the tensors live at the peak of the variant shown (its table, whole), and the
// step's ticks, the live-bytes curve, the peak, the what-if and fit answers.
function peakRows(ui) {
  if (!ui.box.slider) return [];
  const p = ui.v.peaks[ui.variant()];
  return p.tensors.map(([id, n]) => {
    const t = ui.byId.get(id);
    return { tensor: t.name, category: t.category, bytes: n, region: t.region, offset: t.offset, written_by: t.producer, layer: t.layer || "" };
  });
}
function inspectorData(ui) {
  if (!ui.box.slider) return { ready: false };
  const name = ui.variant(), p = ui.v.peaks[name];
  return { variant: name, arena_bytes: ui.v.arena_bytes, tick: ui.model.get("tick"),
    peak: { bytes: p.bytes, time: p.time, op: p.op, layer: p.layer, program: p.program, by_category: p.by_category, tensors: peakRows(ui) },
    live_bytes: ui.v.curves[name], ticks: ui.v.ticks.map((k) => ({ t: k.t, op: k.op, layer: k.layer, graph_id: k.gid, program: k.program })),
    what_if: ui.model.get("whatif_result") || {}, fit: ui.model.get("fit_result") || {} };
}

function render({ model, el }) {
  el.classList.add("rnb", "rnb-card", "rnb-inspector");
  const ui = makeUi(model, el);
  liveView(model, el, [["← →", "the previous or next node (the scrubber focused)"], ["Home End", "the step's first or last node"],
    ["Enter", "apply a field (batch, resolution, budget)"]], (e) => scrubKeys(ui, e));
  el.addEventListener("click", (e) => {  // every tensor drawn: chips, strip boxes, table rows
    const hit = e.target.closest ? e.target.closest(PICKABLE) : null;
    if (hit && el.contains(hit) && hit.hasAttribute("data-tensor")) ui.pick(hit.getAttribute("data-tensor"));
  });
  const when = (f) => () => { if (ui.box.slider) f(); };
  const handlers = [["change:view", () => draw(ui)], ["change:tick", when(() => updateScrub(ui))],
    ["change:variant", when(() => { drawCurve(ui); updateScrub(ui); updatePeak(ui); })],
    ["change:selected", when(() => markPicked(ui))], ["change:tensor", when(() => updateTensor(ui))],
    ["change:whatif_result", when(() => updateWhatif(ui))], ["change:fit_result", when(() => updateWhatif(ui))],
    ["change:what_if", when(() => ui.box.controls.replaceChildren(controls(ui)))]];
  draw(ui);
  exportBar(el, { name: "memory_inspector", picture: () => el.querySelector(".rnb-insp-scrubber"),
    rows: () => peakRows(ui), data: () => inspectorData(ui) });
  for (const [e, f] of handlers) model.on(e, f);
  return () => { for (const [e, f] of handlers) model.off(e, f); };
}

export default { render };
