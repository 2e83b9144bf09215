// TrainingMonitor: four small charts (loss, top-1, learning rate, step time) drawn once and
// updated in place as epochs arrive, so the curves grow without flicker.

const STATUS = { running: "#3b6fb6", paused: "#7a6fb0", done: "#4f9d4a", interrupted: "#e07b39", error: "#c2334d" };  // theme.RUN_STATUS_COLORS
const W = 360, H = 170, L = 50, R = 10, T = 10, B = 36;

// A round step (1, 2 or 5 times a power of ten) giving about n intervals over span.
function niceStep(span, n) {
  const raw = Math.max(span, 1e-12) / n;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const f = raw / p;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
}

// Ticks of a log axis: 1, 2 and 5 times each power of ten in [lo, hi] (only the powers when many).
function logTicks(lo, hi) {
  const out = [], many = Math.log10(hi / lo) > 2.5;
  for (let p = Math.floor(Math.log10(lo)); p <= Math.ceil(Math.log10(hi)); p++) {
    for (const m of many ? [1] : [1, 2, 5]) { const y = m * Math.pow(10, p); if (y >= lo * 0.999 && y <= hi * 1.001) out.push(y); }
  }
  return out;
}

// A chart whose axes, grid and series are SVG elements created once and then only updated.
function chart(title, key, series, xlabel = "epoch") {
  const value = h("span", {}, "");
  const state = { log: false };
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "rnb-chart-svg", "data-chart": key });
  const grid = s("g"), axes = s("g"), layer = s("g");
  svg.append(grid, axes, layer);
  const paths = series.map((sr) => {
    const p = s("path", { fill: "none", stroke: sr.color, "stroke-width": sr.width || 1.8, "stroke-dasharray": sr.dash || "",
      "stroke-linejoin": "round", "stroke-linecap": "round", "data-series": sr.name });
    const dots = s("g", { fill: sr.color });
    layer.append(p, dots);
    return { ...sr, p, dots };
  });
  const bars = s("g", { fill: series[0].color });
  layer.append(bars);
  const empty = s("text", { x: W / 2, y: H / 2, "text-anchor": "middle", "font-size": 12, fill: "#667085", class: "rnb-svg-ax" }, "waiting for the first epoch…");
  svg.append(empty);
  const box = h("div", { class: "rnb-chart", "data-chart": key },
    h("div", { class: "rnb-chart-title" }, title, value), svg,
    h("div", { class: "rnb-chart-note", "data-note": key }),
    h("div", { class: "rnb-legend", style: { margin: "0 0 2px 0" } },
      ...series.filter((x) => x.label).map((x) => h("span", {},
        h("span", { class: "rnb-swatch", style: { background: x.color } }), x.label))));

  function update(given, xmax, opts = {}) {
    // given: { name: [[x, y], ...] }; a diverged run's non-finite values arrive as null: left out (gaps)
    const log = state.log;
    const keep = ([, y]) => Number.isFinite(y) && (!log || y > 0);
    const data = Object.fromEntries(Object.entries(given).map(([k, q]) => [k, q.filter(keep)]));
    const pts = Object.values(data).flat().concat(opts.bars || []);
    empty.style.display = pts.length ? "none" : "";
    let ymin = opts.ymin ?? Math.min(...pts.map((q) => q[1]));
    let ymax = opts.ymax ?? Math.max(...pts.map((q) => q[1]));
    if (!pts.length) { ymin = log ? 0.1 : 0; ymax = 1; }
    let ticks;
    if (log) {  // whole decades (or 1-2-5 steps inside one): the axis only moves when a curve leaves it
      ymin = Math.pow(10, Math.floor(Math.log10(ymin) * 2) / 2);
      ymax = Math.pow(10, Math.ceil(Math.log10(ymax) * 2) / 2);
      if (ymax <= ymin) ymax = ymin * 10;
      ticks = logTicks(ymin, ymax);
    } else {  // the range snapped to round ticks: they stay put while the curve moves inside it
      if (ymax - ymin < 1e-12) { ymax += Math.abs(ymax) * 0.1 + 1e-6; ymin -= Math.abs(ymin) * 0.1; }
      const step = niceStep(ymax - ymin, 4);
      if (opts.ymin == null) ymin = Math.floor(ymin / step - 0.05) * step;
      if (opts.ymax == null) ymax = Math.ceil(ymax / step + 0.05) * step;
      ticks = [];
      for (let y = Math.ceil(ymin / step - 1e-9) * step; y <= ymax + step * 1e-6; y += step) ticks.push(Math.abs(y) < step * 1e-6 ? 0 : y);
    }
    const X = (x) => L + (x / Math.max(xmax, 1e-9)) * (W - L - R);
    const Y = log ? (y) => T + (1 - Math.log10(y / ymin) / Math.log10(ymax / ymin)) * (H - T - B)
      : (y) => T + (1 - (y - ymin) / (ymax - ymin)) * (H - T - B);
    grid.replaceChildren(); axes.replaceChildren();
    const span = ticks.length > 1 ? ticks[1] - ticks[0] : 1;
    const digits = Math.max(0, -Math.floor(Math.log10(span) + 1e-9));
    for (const y of ticks) {
      grid.append(s("line", { x1: L, x2: W - R, y1: Y(y), y2: Y(y), stroke: "#eef0f3", class: "rnb-svg-grid" }));
      const label = y === 0 ? "0" : (log ? (y >= 0.01 && y < 1e4 ? String(+y.toPrecision(2)) : y.toExponential(0))
        : (span < 0.01 ? y.toExponential(1) : y.toFixed(Math.min(digits, 4))));
      axes.append(s("text", { x: L - 5, y: Y(y) + 3.5, "text-anchor": "end", "font-size": 12, fill: "#667085", class: "rnb-svg-ax" }, label));
    }
    const xstep = Math.max(1, niceStep(xmax, 6));
    for (let x = 0; x <= xmax + 1e-9; x += xstep) {
      axes.append(s("text", { x: X(x), y: H - B + 14, "text-anchor": "middle", "font-size": 12, fill: "#667085", class: "rnb-svg-ax" }, +x.toFixed(6)));
    }
    axes.append(s("text", { x: L + (W - L - R) / 2, y: H - 3, "text-anchor": "middle", "font-size": 12, fill: "#475467", class: "rnb-svg-ax",
      "data-axis": "x" }, xlabel));
    axes.append(s("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: "#c0c6d0", class: "rnb-svg-tick" }));
    for (const sr of paths) {
      const q = data[sr.name] || [];
      sr.p.setAttribute("d", q.map(([x, y], i) => `${i ? "L" : "M"}${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join(""));
      sr.dots.replaceChildren(...(sr.dots_on ? q.map(([x, y]) => s("circle", { cx: X(x), cy: Y(y), r: 2.6 })) : []));
    }
    bars.replaceChildren();
    if (opts.bars) {
      const bw = Math.max(((W - L - R) / Math.max(xmax, 1)) * 0.55, 3);
      for (const [x, y] of opts.bars) {
        bars.append(s("rect", { x: X(x) - bw / 2, y: Y(y), width: bw, height: Math.max(H - B - Y(y), 1), rx: 2 }));
      }
      empty.style.display = opts.bars.length ? "none" : "";
    }
    if (opts.marker != null) {
      axes.append(s("line", { x1: X(opts.marker), x2: X(opts.marker), y1: T, y2: H - B, stroke: "#98a2b3", "stroke-dasharray": "3 3" }));
    }
  }
  return { box, update, value, state, note: box.querySelector(".rnb-chart-note") };
}

// "epoch 2/30 · step 120/250 · 85 steps/s · 1 min 12 s left": a run's place, from the monitor's progress.
function progressText(p, total) {
  const rate = p.steps_per_s, left = p.seconds_left;
  const time = left == null ? "" : left >= 3600 ? `${Math.floor(left / 3600)} h ${Math.round((left % 3600) / 60)} min`
    : left >= 60 ? `${Math.floor(left / 60)} min ${Math.round(left % 60)} s` : `${Math.round(left)} s`;
  return `epoch ${p.epoch}/${total} · step ${p.step_in_epoch}/${p.steps_per_epoch}`
    + (rate ? ` · ${rate >= 10 ? Math.round(rate) : rate.toFixed(1)} steps/s · ${time} left` : "");
}

function render({ model, el }) {
  el.classList.add("rnb", "rnb-card", "rnb-monitor");
  liveView(model, el);
  const status = h("span", { class: "rnb-pill", "data-status": "" });
  const bar = h("div", { class: "rnb-bar" }, h("div", { style: { width: "0%" } }));
  const count = h("span", { class: "rnb-muted rnb-progress-text", style: { fontVariantNumeric: "tabular-nums" } });
  const buttons = h("span", { class: "rnb-row" });
  const error = h("div");
  el.append(
    h("div", { class: "rnb-row" }, h("span", { class: "rnb-title" }, "Training"), status, bar, count, buttons),
    error);
  const grid = h("div", { class: "rnb-monitor-grid", style: { marginTop: "8px" } });
  const loss = chart("loss", "loss", [
    { name: "step", color: "#a9c0e4", width: 1.1 },
    { name: "train", color: "#3b6fb6", dots_on: true, label: "train (epoch mean)" },
    { name: "val", color: "#e07b39", dash: "4 3", dots_on: true, label: "validation" }]);
  loss.box.querySelector(".rnb-legend").prepend(h("span", {}, h("span", { class: "rnb-swatch", style: { background: "#a9c0e4" } }), "per step"));
  const logButton = h("button", { class: "rnb-btn rnb-quiet rnb-log-toggle", "data-action": "log", title: "loss on a log scale",
    onclick: () => { loss.state.log = !loss.state.log; logButton.classList.toggle("rnb-active", loss.state.log); draw(); } }, "log");
  loss.box.querySelector(".rnb-chart-title").append(logButton);
  const top1 = chart("top-1 accuracy (%)", "top1", [
    { name: "train", color: "#3b6fb6", dots_on: true, label: "train" },
    { name: "val", color: "#e07b39", dash: "4 3", dots_on: true, label: "validation" }]);
  const lr = chart("learning rate", "lr", [
    { name: "future", color: "#c9dfc6", width: 1.6, dash: "3 3", label: "schedule" },
    { name: "done", color: "#4f9d4a", width: 2, label: "so far" }]);
  const time = chart("time per step (ms, incl. validation)", "time", [{ name: "t", color: "#a58fd6" }]);
  grid.append(loss.box, top1.box, lr.box, time.box);
  el.append(grid);

  function draw() {
    const recs = model.get("records") || [];
    const losses = model.get("step_losses") || [];
    const sched = model.get("lr") || [];
    const total = model.get("total_epochs") || Math.max(recs.length, 1);
    const spe = Math.max(model.get("steps_per_epoch") || 1, 1);
    const st = model.get("status") || "idle";
    el.dataset.epochs = String(recs.length);
    status.textContent = st;
    status.dataset.status = st;
    status.style.background = STATUS[st] || "#98a2b3";
    status.style.color = inkOn(STATUS[st] || "#98a2b3");
    const done = recs.length ? recs[recs.length - 1].epoch : 0;
    const pg = st === "running" ? model.get("progress") || {} : {};
    const frac = pg.total_steps ? pg.step / pg.total_steps : done / Math.max(total, 1);  // within an epoch too
    bar.firstChild.style.width = `${Math.min(100, 100 * frac)}%`;
    count.textContent = pg.total_steps ? progressText(pg, total) : `epoch ${done}/${total}`;
    count.dataset.step = pg.step ?? "";
    const xmax = Math.max(total, done, 1);  // the whole run: the learning-rate schedule is known ahead
    // one point per `every` steps, at its block's last step (views.step_curve, static.curve_x)
    const curve = (values, every, steps) => values.map((y, i) => [Math.min((i + 1) * every, steps) / spe, y]);
    const lossEvery = model.get("loss_every") || 1;
    const stepPts = curve(losses, lossEvery, model.get("loss_steps") || losses.length * lossEvery);
    // the measured curves' x axis fits the data: the epochs trained so far (a first epoch: 0 to 1), not all 30
    const seen = Math.max(done, stepPts.length ? stepPts[stepPts.length - 1][0] : 0);
    const fit = Math.min(xmax, Math.max(1, Math.ceil(seen - 1e-9)));
    el.dataset.xmax = String(fit);
    loss.update({ step: stepPts, train: recs.map((r) => [r.epoch, r.train_loss]),
      val: recs.filter((r) => r.val_loss != null).map((r) => [r.epoch, r.val_loss]) }, fit);
    const last = recs[recs.length - 1];
    const num = (v, f) => (Number.isFinite(v) ? f(v) : "not finite");
    loss.value.textContent = last ? `${num(last.train_loss, (v) => v.toFixed(4))}${last.val_loss != null ? " · val " + num(last.val_loss, (v) => v.toFixed(4)) : ""}` : "";
    top1.update({ train: recs.map((r) => [r.epoch, 100 * r.train_top1]),
      val: recs.filter((r) => r.val_top1 != null).map((r) => [r.epoch, 100 * r.val_top1]) }, fit);
    top1.value.textContent = last ? `${num(100 * last.train_top1, (v) => v.toFixed(2))}%${last.val_top1 != null ? " · val " + num(100 * last.val_top1, (v) => v.toFixed(2)) + "%" : ""}` : "";
    const stepsDone = last ? last.steps : 0;
    const lrEvery = model.get("lr_every") || 1;
    const lrPts = curve(sched, lrEvery, model.get("lr_steps") || sched.length * lrEvery);
    lr.update({ future: lrPts, done: lrPts.filter((p) => p[0] * spe <= stepsDone) }, xmax, { ymin: 0, marker: stepsDone ? stepsDone / spe : null });
    lr.value.textContent = last ? num(last.lr, (v) => v.toExponential(2)) : (sched.length ? num(sched[0], (v) => v.toExponential(2)) : "");
    // a run's first step compiles or loads the kernels: told apart, not averaged into its epoch's steps
    let prev = 0;
    const times = recs.map((r) => {
      const first = r.first_step_seconds || 0, n = Math.max(r.steps - prev - (first > 0 ? 1 : 0), 1);
      prev = r.steps;
      return [r.epoch, (1e3 * (r.seconds - first)) / n];
    });
    time.update({ t: [] }, fit + 0.5, { ymin: 0, bars: times });
    time.value.textContent = times.length ? `${times[times.length - 1][1].toFixed(2)} ms` : "";
    const firsts = recs.filter((r) => (r.first_step_seconds || 0) > 0);
    time.note.textContent = firsts.length ? "first step of a run (kernels compiled or loaded), not in the bars: " +
      firsts.map((r) => `epoch ${r.epoch} ${r.first_step_seconds >= 1 ? r.first_step_seconds.toFixed(2) + " s" : (1e3 * r.first_step_seconds).toFixed(0) + " ms"}`).join(", ") : "";

    buttons.replaceChildren();
    if (st !== "running") stopping = false;
    if (st === "running") {
      buttons.append(h("button", { class: "rnb-btn rnb-danger", "data-action": "stop", disabled: stopping,
        title: "Stop at the next step boundary, as Ctrl-C does: run() afterwards resumes exactly there",
        onclick: stop }, stopping ? "stopping…" : "■ stop"));
    }
    if (model.get("controls")) {
      const running = st === "running";
      buttons.append(
        h("button", { class: "rnb-btn", disabled: running || done >= total, "data-action": "run-1",
          onclick: () => trySend(model, { action: "run", epochs: 1 }) }, "run 1 epoch"),
        h("button", { class: "rnb-btn rnb-primary", disabled: running || done >= total, "data-action": "run",
          onclick: () => trySend(model, { action: "run" }) }, "run()"));
    }
    const err = model.get("error") || {};
    error.replaceChildren(...(err.message ? [h("div", { class: "rnb-error" }, h("b", {}, err.type), err.message)] : []),
      ...(stopNote ? [h("div", { class: "rnb-note", "data-stop-note": "" }, stopNote)] : []));
  }

  // Stop = the kernel's interrupt (SIGINT), which the trainer turns into a stop at the next step boundary
  // (runtime/interrupt.py), resumable like Ctrl-C. A message to the kernel would wait: the kernel reads
  // widget messages only between cells, and run() holds it. The front end's kernel connection does not.
  let stopping = false, stopNote = "";
  async function stop() {
    stopping = true; stopNote = ""; draw();
    const kernel = model.widget_manager && model.widget_manager.kernel;
    try {
      if (!kernel || typeof kernel.interrupt !== "function") throw new Error("this front end gives widgets no kernel connection");
      await kernel.interrupt();
    } catch (e) {
      stopping = false;
      stopNote = `Could not interrupt the kernel (${e && e.message ? e.message : e}): use the notebook's interrupt ` +
        "button (■); the run stops at the next step boundary and run() resumes there.";
      draw();
    }
  }
  draw();
  exportBar(el, { name: "training", picture: () => grid, rows: () => (model.get("records") || []).map((r) => ({ ...r })),
    data: () => Object.fromEntries(["records", "step_losses", "loss_every", "loss_steps", "lr", "lr_every", "lr_steps",
      "total_epochs", "steps_per_epoch", "status"].map((k) => [k, model.get(k)])) });
  const events = ["progress", "records", "step_losses", "loss_every", "loss_steps", "lr", "lr_every", "lr_steps", "status", "total_epochs", "controls", "error"].map((k) => "change:" + k);
  for (const e of events) model.on(e, draw);
  return () => { for (const e of events) model.off(e, draw); };
}

export default { render };
