// MemoryInspectorView: a step scrubber over the step's nodes (the running op, what it reads and writes,
// the live tensors on the arena, live bytes so far), the tensors live at the peak of each variant, what-if
// plans side by side with the current one, the largest batch that fits a budget, and a tensor inspector.
// Python answers every question (display/inspector_view.py); this module draws and sends the picks.

function human(n) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${Math.round(n)} B` : `${n.toFixed(1)} ${units[i]}`;
}
const signed = (n) => (n === 0 ? "0" : (n > 0 ? "+" : "−") + human(Math.abs(n)));
const num = (x, p = 6) => (x == null ? "—" : Number(x).toPrecision(p).replace(/\.?0+(e|$)/, "$1"));
const SW = 760;  // width of the drawings, in SVG units (they scale to the card)

function isLive(t, time) {  // the engine's rule (inspector_data.live_ids): state all step, the rest by interval
  return t.intervals === null || t.intervals.some(([a, b]) => a <= time && time <= b);
}

function render({ model, el }) {
  el.classList.add("rnb", "rnb-card", "rnb-inspector");
  liveView(model, el);
  let v = {}, byId = new Map(), times = [], showAll = false;
  const box = {};  // the sections' containers, refilled as picks change

  const save = (key, value) => { model.set(key, value); model.save_changes(); };
  const pick = (name) => save("selected", name);
  const variant = () => (v.variants.includes(model.get("variant")) ? model.get("variant") : v.variants[0]);
  const vIndex = () => v.variants.indexOf(variant());
  const tickIndex = () => Math.max(0, times.indexOf(model.get("tick")));

  function chip(id, cls) {
    const t = byId.get(id);
    return h("span", { class: `rnb-tensor rnb-insp-chip ${cls}` + (t.name === model.get("selected") ? " rnb-picked" : ""),
      "data-tensor": t.name, style: { borderColor: t.color }, title: `${t.region} · ${t.shape} · click to inspect`,
      onclick: () => pick(t.name) }, t.name);
  }
  function chips(ids, cls, most = 28) {
    const out = ids.slice(0, most).map((i) => chip(i, cls));
    if (ids.length > most) out.push(h("span", { class: "rnb-muted" }, ` … ${ids.length - most} more`));
    return out.length ? out : [h("span", { class: "rnb-muted" }, "nothing")];
  }

  // ---- the step scrubber ---------------------------------------------------------------------------
  function step(by) {
    const i = Math.min(times.length - 1, Math.max(0, tickIndex() + by));
    save("tick", times[i]);
  }
  function keys(e) {  // ← → a node, Home and End the step's ends; kept from the notebook's own shortcuts
    const by = { ArrowLeft: -1, ArrowRight: 1, Home: -1e9, End: 1e9 }[e.key];
    if (by === undefined) return;
    e.preventDefault();
    e.stopPropagation();
    step(by);
  }
  function scrubberSkeleton() {
    const slider = h("input", { type: "range", class: "rnb-insp-slider", min: 0, max: times.length - 1, step: 1,
      value: tickIndex(), "aria-label": "step scrubber: node of the step",
      oninput: (e) => model.set("tick", times[+e.target.value]),  // drawn at once, sent on release
      onchange: (e) => save("tick", times[+e.target.value]),
      onkeydown: keys });  // one node per key, here as on the panel (JupyterLab may keep the native step)
    box.slider = slider;
    box.tickInfo = h("div", { class: "rnb-insp-op" });
    box.rw = h("div", { class: "rnb-insp-rw-box" });
    box.strips = h("div", { class: "rnb-insp-strips" });
    box.curve = h("div", { class: "rnb-insp-curve-box" });
    const sec = h("div", { class: "rnb-insp-section rnb-insp-scrubber", tabindex: 0, onkeydown: keys },
    h("div", { class: "rnb-h" }, "Step scrubber · drag, or focus and use ← →"),
    h("div", { class: "rnb-row" },
      h("button", { class: "rnb-btn rnb-insp-prev", title: "previous node", onclick: () => step(-1) }, "◀"),
      slider,
      h("button", { class: "rnb-btn rnb-insp-next", title: "next node", onclick: () => step(1) }, "▶"),
      h("button", { class: "rnb-btn rnb-quiet rnb-insp-to-peak", onclick: () => save("tick", v.peaks[variant()].time) },
        "go to the peak")),
    box.tickInfo, box.rw, box.strips, box.curve);
    return sec;
  }

  function strip(tick, lo, hi, cls) {
    const span = Math.max(hi - lo, 1), H = 30, vi = vIndex();
    const reads = new Set(tick.reads), writes = new Set(tick.writes), sel = model.get("selected");
    const svg = s("svg", { viewBox: `0 0 ${SW} ${H + 14}`, class: `rnb-insp-strip ${cls}` });
    svg.append(s("rect", { x: 0, y: 0, width: SW, height: H, rx: 5, fill: "#f2f4f7" }));
    for (const t of v.tensors) {
      if (!t.slot_bytes || t.offset + t.slot_bytes <= lo || t.offset >= hi) continue;
      const a = Math.max(t.offset, lo), b = Math.min(t.offset + t.slot_bytes, hi);
      const on = isLive(t, tick.t), w = reads.has(t.id), wr = writes.has(t.id);
      const r = s("rect", { x: ((a - lo) / span) * SW, y: 2, width: Math.max(((b - a) / span) * SW, 1), height: H - 4,
        fill: t.color, "fill-opacity": on ? 1 : 0.12, class: "rnb-insp-box" + (t.name === sel ? " rnb-picked" : ""),
        stroke: wr ? "#1f2328" : w ? "#ffffff" : "none", "stroke-width": 1.4, "stroke-dasharray": w && !wr ? "3 2" : "none",
        "data-tensor": t.name, "data-live": on ? 1 : 0 });
      r.append(s("title", {}, `${t.name} · ${t.region} · offset ${t.offset.toLocaleString()} · ${human(t.storage[vi])}`
        + (on ? " · live" : "") + (wr ? " · written here" : w ? " · read here" : "")));
      r.addEventListener("click", () => pick(t.name));
      svg.append(r);
    }
    svg.append(s("text", { x: 0, y: H + 12, "font-size": 10, fill: "#667085" }, lo.toLocaleString()),
      s("text", { x: SW, y: H + 12, "font-size": 10, fill: "#667085", "text-anchor": "end" }, `${hi.toLocaleString()} bytes`));
    return svg;
  }

  function curve(at) {
    const c = v.curves[variant()], H = 90, n = Math.max(c.length - 1, 1), top = Math.max(...c, 1);
    const X = (t) => (t / n) * SW, Y = (b) => H - (b / top) * (H - 6);
    const svg = s("svg", { viewBox: `0 0 ${SW} ${H + 14}`, class: "rnb-insp-curve" });
    for (const p of programs()) svg.append(s("rect", { x: X(p.start), y: 0, width: Math.max(X(p.end) - X(p.start), 1), height: H, fill: "#f6f8fa" }));
    svg.append(s("polyline", { points: c.map((b, i) => `${X(i).toFixed(1)},${Y(b).toFixed(1)}`).join(" "), fill: "none", stroke: "#3b6fb6", "stroke-width": 1.4 }));
    svg.append(s("polygon", { points: `0,${H} ` + c.slice(0, at + 1).map((b, i) => `${X(i).toFixed(1)},${Y(b).toFixed(1)}`).join(" ") + ` ${X(at)},${H}`,
      fill: "#3b6fb6", "fill-opacity": 0.15 }));  // "so far": the step up to the scrubber
    const pk = v.peaks[variant()].time;
    svg.append(s("line", { x1: X(pk), x2: X(pk), y1: 0, y2: H, stroke: "#c2334d", "stroke-dasharray": "4 3" }));
    svg.append(s("line", { x1: X(at), x2: X(at), y1: 0, y2: H, stroke: "#1f2328", "stroke-width": 1.6, class: "rnb-insp-marker", "data-tick": at }));
    svg.append(s("circle", { cx: X(at), cy: Y(c[at] || 0), r: 3.5, fill: "#1f2328" }));
    svg.append(s("text", { x: 0, y: H + 12, "font-size": 10, fill: "#667085" }, "tick 0"),
      s("text", { x: SW, y: H + 12, "font-size": 10, fill: "#667085", "text-anchor": "end" }, `live bytes · peak ${human(top)} (red)`));
    return svg;
  }

  function programs() {
    const out = [];
    for (const k of v.ticks) {
      const last = out[out.length - 1];
      if (last && last.name === k.program) last.end = k.t; else out.push({ name: k.program, start: k.t, end: k.t });
    }
    return out;
  }

  function updateScrub() {
    if (!box.slider) return;
    const i = tickIndex(), tick = v.ticks[i], live = v.curves[variant()][tick.t] || 0;
    if (+box.slider.value !== i) box.slider.value = i;
    const ranges = [...tick.ranges_read.map((r) => `reads ${r}`), ...tick.ranges_written.map((r) => `writes ${r}`)];
    box.tickInfo.replaceChildren(
      h("div", { class: "rnb-row" },
        h("span", { class: "rnb-pill", style: { background: "#3b6fb6" }, "data-tick": tick.t }, `tick ${tick.t}`),
        h("span", { class: "rnb-muted" }, `node ${i + 1} of ${times.length} · ${tick.program}`),
        h("b", { class: "rnb-mono rnb-insp-opname", "data-op": tick.op }, tick.op),
        h("span", {}, h("span", { class: "rnb-muted" }, "layer "), h("span", { class: "rnb-insp-layer" }, tick.layer || "-")),
        h("span", {}, h("span", { class: "rnb-muted" }, "GraphId "), h("span", { class: "rnb-mono rnb-insp-gid" }, tick.gid)),
        h("span", { class: "rnb-grow" }),
        h("span", { class: "rnb-stat" }, h("b", { class: "rnb-insp-live", "data-bytes": live }, human(live)), h("span", {}, `live (${variant()})`))),
      ranges.length ? h("div", { class: "rnb-muted rnb-insp-ranges" }, "region-wide: " + ranges.join("; ")) : "");
    box.rw.replaceChildren(
      h("div", { class: "rnb-insp-rw rnb-insp-reads", "data-count": tick.reads.length }, h("span", { class: "rnb-k" }, `reads ${tick.reads.length}`), ...chips(tick.reads, "rnb-read")),
      h("div", { class: "rnb-insp-rw rnb-insp-writes", "data-count": tick.writes.length }, h("span", { class: "rnb-k" }, `writes ${tick.writes.length}`), ...chips(tick.writes, "rnb-write")));
    const [lo, hi] = v.focus_range;
    box.strips.replaceChildren(
      h("div", { class: "rnb-sub" }, `The arena (${v.arena_human}): live tensors coloured by region family; read here: white dashed, written: black · click one to inspect it`),
      strip(tick, 0, v.arena_bytes, "rnb-insp-arena"),
      h("div", { class: "rnb-sub" }, `Feature maps and temporaries, bytes ${lo.toLocaleString()}–${hi.toLocaleString()}`),
      strip(tick, lo, hi, "rnb-insp-focus"));
    box.curve.replaceChildren(curve(tick.t));
  }

  // ---- live at the peak --------------------------------------------------------------------------------
  function stack(rows, total, cls) {
    const colours = Object.fromEntries(v.categories.map((c) => [c.category, c.color]));
    const bar = h("div", { class: `rnb-insp-stack ${cls}` });
    for (const r of rows) {
      if (!r.bytes) continue;
      bar.append(h("div", { class: "rnb-insp-stack-seg", "data-category": r.category, "data-bytes": r.bytes,
        title: `${r.category}: ${human(r.bytes)}`, style: { width: `${(r.bytes / Math.max(total, 1)) * 100}%`, background: colours[r.category] } }));
    }
    return bar;
  }
  function legend(rows) {
    const colours = Object.fromEntries(v.categories.map((c) => [c.category, c.color]));
    return h("div", { class: "rnb-legend" }, ...rows.filter((r) => r.bytes).map((r) =>
      h("span", { "data-category": r.category }, h("span", { class: "rnb-swatch", style: { background: colours[r.category] } }), h("b", {}, r.category), ` ${human(r.bytes)}`)));
  }

  function updatePeak() {
    const name = variant(), p = v.peaks[name];
    const seg = h("div", { class: "rnb-seg rnb-insp-variants" }, ...v.variants.map((x) =>
      h("button", { class: x === name ? "rnb-on" : "", "data-variant": x, onclick: () => save("variant", x) }, x)));
    const rows = showAll ? p.tensors : p.tensors.slice(0, 20);
    const table = h("table", { class: "rnb-table rnb-insp-peak-table" }, h("tr", {},
      ...["tensor", "category", "bytes", "written by", "layer"].map((c, i) => h("th", { class: i === 2 ? "rnb-num" : "" }, c))));
    for (const [id, n] of rows) {
      const t = byId.get(id);
      table.append(h("tr", { "data-tensor": t.name, class: "rnb-insp-pick" + (t.name === model.get("selected") ? " rnb-picked" : ""), onclick: () => pick(t.name) },
        h("td", { class: "rnb-mono" }, h("span", { class: "rnb-swatch", style: { background: t.color } }), t.name),
        h("td", {}, t.category), h("td", { class: "rnb-num", "data-bytes": n }, human(n)),
        h("td", { class: "rnb-mono" }, t.producer), h("td", {}, t.layer || "-")));
    }
    const more = p.tensors.length > 20 ? h("button", { class: "rnb-btn rnb-quiet", onclick: () => { showAll = !showAll; updatePeak(); } },
      showAll ? "show the 20 largest" : `show all ${p.tensors.length}`) : "";
    box.peak.replaceChildren(
      h("div", { class: "rnb-h" }, "Live at the peak"),
      h("div", { class: "rnb-row" }, h("span", { class: "rnb-muted" }, "variant"), seg),
      h("div", { class: "rnb-row", style: { margin: "8px 0" } },
        h("span", { class: "rnb-stat" }, h("b", { class: "rnb-insp-peak-bytes", "data-bytes": p.bytes }, p.human), h("span", {}, `peak of a ${human(p.arena)} arena`)),
        h("span", { class: "rnb-grow rnb-muted" }, `at tick ${p.time}: ${p.op} (${p.layer || "-"}) in ${p.program} · ${p.tensors.length} tensors live`),
        h("button", { class: "rnb-btn", onclick: () => save("tick", p.time) }, "scrub to it")),
      stack(p.by_category, p.bytes, "rnb-insp-peak-stack"), legend(p.by_category), table, more);
  }

  // ---- what-if ------------------------------------------------------------------------------------------
  function asked() { return { ...v.settings, ...(model.get("what_if") || {}) }; }
  function ask(key, value) {
    const next = { ...(model.get("what_if") || {}), [key]: value };
    if (JSON.stringify(value) === JSON.stringify(v.settings[key])) delete next[key];  // back to the current value
    save("what_if", next);
  }
  function controls() {
    const a = asked(), st = v.settings, out = h("div", { class: "rnb-row rnb-insp-controls" });
    out.append(h("label", {}, "batch ", h("input", { type: "number", min: 1, class: "rnb-insp-batch", value: a.batch_size,
      onchange: (e) => ask("batch_size", parseInt(e.target.value, 10)) })));
    if (st.image) {
      const res = (i) => h("input", { type: "number", min: 1, class: `rnb-insp-res rnb-insp-res-${i}`, value: a.resolution[i],
        onchange: () => ask("resolution", [0, 1].map((k) => parseInt(out.querySelector(`.rnb-insp-res-${k}`).value, 10))) });
      out.append(h("label", {}, "resolution ", res(0), " × ", res(1)));
    }
    for (const [key, label] of [["liveness", "liveness reuse"], ["pad_rows", "row padding"], ["fuse", "fusion"], ["ema", "EMA"]]) {
      out.append(h("label", { class: "rnb-insp-toggle" }, h("input", { type: "checkbox", "data-setting": key, checked: !!a[key],
        onchange: (e) => ask(key, e.target.checked) }), ` ${label}`));
    }
    const sel = h("select", { class: "rnb-select rnb-insp-optimizer", onchange: (e) => ask("optimizer", e.target.value) },
      ...v.optimizers.map((o) => h("option", { value: o, selected: o === a.optimizer }, { sgd: "SGD", sgd_momentum: "SGD + momentum", adam: "Adam", adamw: "AdamW" }[o])));
    out.append(h("label", {}, "optimizer ", sel),
      h("button", { class: "rnb-btn rnb-quiet rnb-insp-reset", onclick: () => save("what_if", {}) }, "as now"));
    return out;
  }

  function side(r, k) {
    const total = Math.max(...r.arena, 1), rows = r.categories.map((c) => ({ category: c.category, bytes: k ? c.b : c.a }));
    return h("div", { class: `rnb-insp-side rnb-insp-side-${k ? "whatif" : "current"}` },
      h("div", {}, h("b", {}, k ? `what-if: ${r.labels[k]}` : "now")),
      h("div", { class: "rnb-row", style: { margin: "4px 0" } },
        h("span", { class: "rnb-stat" }, h("b", { class: "rnb-insp-arena-bytes", "data-bytes": r.arena[k] }, r.arena_human[k]), h("span", {}, "arena")),
        h("span", { class: "rnb-stat" }, h("b", { "data-bytes": r.peak[k] }, r.peak_human[k]), h("span", {}, "peak"))),
      h("div", { style: { width: `${(r.arena[k] / total) * 100}%` } }, stack(rows, r.arena[k], "")), legend(rows));
  }

  function diffTable(rows, key, head) {
    const t = h("table", { class: `rnb-table rnb-insp-diff-${key}` }, h("tr", {}, h("th", {}, head), h("th", { class: "rnb-num" }, "now"),
      h("th", { class: "rnb-num" }, "what-if"), h("th", { class: "rnb-num" }, "change")));
    for (const x of rows) {
      const name = x[key], clickable = key === "name";
      t.append(h("tr", { "data-name": name, class: clickable ? "rnb-insp-pick" : "", onclick: clickable ? () => pick(name) : null },
        h("td", { class: "rnb-mono" }, name), h("td", { class: "rnb-num", "data-bytes": x.a }, human(x.a)),
        h("td", { class: "rnb-num", "data-bytes": x.b }, human(x.b)), h("td", { class: "rnb-num" }, signed(x.change))));
    }
    return t;
  }

  function movedTable(r) {
    const t = h("table", { class: "rnb-table rnb-insp-moved" }, h("tr", {}, h("th", {}, "tensor"), h("th", { class: "rnb-num" }, "offset now"), h("th", { class: "rnb-num" }, "what-if")));
    for (const m of r.moved.slice(0, 40)) {
      t.append(h("tr", { "data-tensor": m.name, class: "rnb-insp-pick", onclick: () => pick(m.name) }, h("td", { class: "rnb-mono" }, m.name),
        h("td", { class: "rnb-num rnb-mono" }, m.a.toLocaleString()), h("td", { class: "rnb-num rnb-mono" }, m.b.toLocaleString())));
    }
    return t;
  }

  function updateWhatif() {
    const r = model.get("whatif_result") || {}, out = [];
    if (r.error) out.push(h("div", { class: "rnb-error rnb-insp-whatif-error" }, r.error));
    else if (!r.summary) out.push(h("div", { class: "rnb-muted" }, "Change a setting above: the plan is made again (planning only, no kernels) and set beside this one."));
    else {
      out.push(h("div", { class: "rnb-note rnb-whatif-summary" }, r.summary),
        h("div", { class: "rnb-insp-sides" }, side(r, 0), side(r, 1)),
        h("div", { class: "rnb-h" }, "By category"),
        diffTable(r.categories.filter((c) => c.a || c.b), "category", "category"));
      if (r.grew.length || r.shrank.length) out.push(h("div", { class: "rnb-h" }, `Regions that grew (${r.grew.length}) or shrank (${r.shrank.length})`), diffTable([...r.grew, ...r.shrank], "region", "region"));
      if (r.n_moved) out.push(h("div", { class: "rnb-h" }, `Tensors that moved (${r.n_moved})` + (r.n_moved > 40 ? ", the first 40" : "")), movedTable(r));
      if (r.resized.length) out.push(h("div", { class: "rnb-h" }, `Tensors resized (${r.resized.length})`), diffTable(r.resized.slice(0, 40), "name", "tensor"));
      if (r.added.length || r.removed.length) out.push(h("div", { class: "rnb-muted" }, (r.added.length ? `added: ${r.added.join(", ")} ` : "") + (r.removed.length ? `removed: ${r.removed.join(", ")}` : "")));
    }
    box.whatifResult.replaceChildren(...out);
    const f = model.get("fit_result") || {};
    box.fitAnswer.replaceChildren(f.error ? h("span", { class: "rnb-error" }, f.error) : f.batch == null ? "" :
      h("span", { "data-batch": f.batch }, `Largest batch that fits in ${f.budget_human} (${f.settings}): `, h("b", { class: "rnb-insp-fit-batch" }, f.batch),
        `, arena ${f.arena_human}` + (f.next_human ? `; batch ${f.batch + 1} would need ${f.next_human}` : ` (the whole training set: ${f.limit})`)));
  }

  function whatifSkeleton() {
    box.controls = h("div", {}, controls());
    box.whatifResult = h("div", { class: "rnb-insp-whatif-result" });
    box.fitAnswer = h("div", { class: "rnb-insp-fit" });
    const budget = model.get("fit_budget");
    const mib = h("input", { type: "number", min: 0.01, step: "any", class: "rnb-insp-budget", value: budget ? budget / 2 ** 20 : Math.ceil(2 * v.arena_bytes / 2 ** 20) });
    const go = () => save("fit_budget", Math.round(parseFloat(mib.value) * 2 ** 20));
    mib.addEventListener("keydown", (e) => { if (e.key === "Enter") go(); });
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
    svg.append(s("text", { x: 0, y: H + 12, "font-size": 10, fill: "#667085" }, num(st.edges[0], 4)),
      s("text", { x: W, y: H + 12, "font-size": 10, fill: "#667085", "text-anchor": "end" }, num(st.edges[st.edges.length - 1], 4)));
    return svg;
  }

  function stat(label, value, cls) {
    const text = Number.isInteger(value) ? value.toLocaleString() : num(value, 5);
    return h("span", { class: `rnb-stat ${cls}`, "data-value": value == null ? "" : String(value) }, h("b", {}, text), h("span", {}, label));
  }
  function sizes(storage) {  // the bytes each variant uses, variants of one size together
    const groups = new Map();
    storage.forEach((n, i) => groups.set(n, [...(groups.get(n) || []), v.variants[i]]));
    if (groups.size === 1) return `${human(storage[0])} used in every variant`;
    return [...groups].map(([n, names]) => `${human(n)} in ${names.join(", ")}`).join("; ");
  }

  function updateTensor() {
    const t = model.get("tensor") || {};
    if (!t.name) { box.tensor.replaceChildren(h("div", { class: "rnb-h" }, "Tensor inspector"), h("div", { class: "rnb-muted" }, "Click any tensor (in the arena strips, the peak table, the what-if tables or a chip) to see it here.")); return; }
    if (t.error) { box.tensor.replaceChildren(h("div", { class: "rnb-h" }, "Tensor inspector"), h("div", { class: "rnb-error" }, t.error)); return; }
    const live = t.intervals === null ? "the whole step (state)" : t.intervals.map(([a, b]) => `ticks ${a}–${b}`).join(", ") || "never";
    const rows = [["shape", `${t.shape} ${t.dtype}`], ["region", `${t.region} (${t.category})`], ["offset", `${t.offset.toLocaleString()} (0x${t.offset.toString(16)})`],
      ["bytes", `${t.slot_bytes.toLocaleString()}-byte slot · ` + sizes(t.storage)],
      ["live", live], ["written by", `${t.producer} (${t.layer || "-"}) · written at ${t.writes_at.length}, read at ${t.reads_at.length} ticks`]];
    const out = [h("div", { class: "rnb-h" }, "Tensor inspector"),
      h("div", { class: "rnb-row" }, h("span", { class: "rnb-swatch", style: { background: t.color } }), h("b", { class: "rnb-mono rnb-insp-tensor-name" }, t.name),
        h("span", { class: "rnb-grow" }), h("button", { class: "rnb-btn rnb-quiet", onclick: () => pick("") }, "close")),
      h("table", { class: "rnb-table rnb-insp-tensor-table" }, ...rows.map(([k, x]) => h("tr", {}, h("th", {}, k), h("td", { class: "rnb-mono" }, x))))];
    const st = t.stats;
    if (st) {
      out.push(h("div", { class: "rnb-row rnb-insp-values" }, st.counts.length ? histogram(st) : h("span", { class: "rnb-muted" }, "no finite value"),
        h("div", { class: "rnb-row rnb-insp-stats" }, stat("min", st.min, "rnb-insp-min"), stat("max", st.max, "rnb-insp-max"), stat("mean", st.mean, "rnb-insp-mean"),
          stat("std", st.std, "rnb-insp-std"), stat("NaN", st.nan, "rnb-insp-nan"), stat("Inf", st.inf, "rnb-insp-inf"), stat("values", st.size, "rnb-insp-size"))));
      const u = st.update;
      if (u) out.push(h("div", { class: "rnb-row rnb-insp-update" }, stat(`gradient norm (step ${u.step})`, u.grad_norm, "rnb-insp-gnorm"), stat("|W|", u.weight_norm, "rnb-insp-wnorm"),
        stat("|dW|", u.update_norm, "rnb-insp-dnorm"), stat("update ratio |dW|/|W|", u.ratio, "rnb-insp-ratio"), h("span", { class: "rnb-muted rnb-grow" }, `lr ${num(u.lr, 4)} · ${u.how}`)));
    }
    if (t.note) out.push(h("div", { class: "rnb-muted rnb-insp-note" }, t.note));
    box.tensor.replaceChildren(...out);
  }

  // ---- the whole widget -------------------------------------------------------------------------------------
  function draw() {
    v = model.get("view") || {};
    el.replaceChildren();
    if (!v.ready || !v.ticks.length) {
      el.append(h("div", { class: "rnb-title" }, "Memory inspector"), h("div", { class: "rnb-note" }, v.reason || "The plan has no nodes to scrub."));
      box.slider = null;
      return;
    }
    byId = new Map(v.tensors.map((t) => [t.id, t]));
    times = v.ticks.map((k) => k.t);
    box.peak = h("div", { class: "rnb-insp-section rnb-insp-peak" });
    box.tensor = h("div", { class: "rnb-insp-section rnb-insp-tensor" });
    el.append(h("div", { class: "rnb-row" }, h("div", { class: "rnb-grow" }, h("div", { class: "rnb-title" }, "Memory inspector"),
      h("div", { class: "rnb-sub" }, `${times.length} nodes in the step · ${v.tensors.length} tensors · phase ${v.phase}` + (v.compiled ? "" : " · values after compile()"))),
    h("span", { class: "rnb-stat" }, h("b", {}, v.arena_human), h("span", {}, "arena"))),
    scrubberSkeleton(), box.peak, whatifSkeleton(), box.tensor);
    updateScrub(); updatePeak(); updateWhatif(); updateTensor();
  }

  function syncControls() {  // the what-if asked in code (or reset): the controls show it
    if (box.controls && v.ready) box.controls.replaceChildren(controls());
  }
  const onVariant = () => { if (box.slider) { updateScrub(); updatePeak(); } };
  const onTensor = () => { if (box.slider) { updateTensor(); updateScrub(); updatePeak(); } };
  const onTick = () => { if (box.slider) updateScrub(); };
  const onAnswer = () => { if (box.slider) updateWhatif(); };
  const handlers = [["change:view", draw], ["change:tick", onTick], ["change:variant", onVariant], ["change:selected", onTensor],
    ["change:tensor", onTensor], ["change:whatif_result", onAnswer], ["change:fit_result", onAnswer], ["change:what_if", syncControls]];
  draw();
  for (const [e, f] of handlers) model.on(e, f);
  return () => { for (const [e, f] of handlers) model.off(e, f); };
}

export default { render };
