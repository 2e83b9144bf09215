// LifetimeView: step order (x) by byte offset (y), one box per live interval of a tensor,
// like XLA's memory viewer. Boxes on the same bytes at different times = liveness reuse.

const esc = (x) => String(x).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

// One row per live interval of a tensor: what the chart draws as a box.
function lifetimeRows(v) {
  if (!v.ready) return [];
  return v.tensors.flatMap((t) => t.intervals.map(([a, b]) => ({ name: t.name, region: t.region, offset: t.offset,
    slot_bytes: t.slot_bytes, first_step: a, last_step: b, reusable: !!t.reusable, shares_with: (t.shares || []).join(" ") })));
}

function render({ model, el }) {
  el.classList.add("rnb", "rnb-card", "rnb-lifetimes");
  liveView(model, el);
  const tip = h("div", { class: "rnb-tip" });
  tip.style.display = "none";
  document.body.append(tip);
  const showTip = (ev, html) => {
    tip.innerHTML = html;
    tip.style.display = "block";
    const r = tip.getBoundingClientRect();
    let x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + r.width > window.innerWidth - 4) x = ev.clientX - r.width - 14;
    if (y + r.height > window.innerHeight - 4) y = ev.clientY - r.height - 14;
    tip.style.left = x + "px"; tip.style.top = y + "px";
  };

  function draw() {
    const v = model.get("view") || {};
    const scope = model.get("scope") || "reusable";
    el.replaceChildren();
    el.append(h("div", { class: "rnb-title" }, "Lifetimes"));
    if (!v.ready) {
      el.append(h("div", { class: "rnb-note" }, "No lifetimes yet: they come with the memory plan."));
      return;
    }
    const tensors = v.tensors.filter((t) => scope === "arena" || t.reusable);
    const sharedWith = new Map();
    for (const p of v.shared) {
      if (!sharedWith.has(p.a_id)) sharedWith.set(p.a_id, []);
      if (!sharedWith.has(p.b_id)) sharedWith.set(p.b_id, []);
      sharedWith.get(p.a_id).push(p.b); sharedWith.get(p.b_id).push(p.a);
    }
    const sub = v.summary;  // the same sentence as the static copy's, written by views.lifetime_view
    const seg = h("div", { class: "rnb-seg" },
      ...[["reusable", "feature maps & temporaries"], ["arena", "whole arena"]].map(([k, label]) =>
        h("button", { class: scope === k ? "rnb-on" : "", "data-scope": k,
          onclick: () => { model.set("scope", k); model.save_changes(); } }, label)));
    el.append(h("div", { class: "rnb-row" }, h("div", { class: "rnb-sub rnb-grow", style: { margin: 0 } }, sub), seg));

    const W = 760, left = 84, right = 10, top = 30, H = 280, bottom = 34;
    const pw = W - left - right;
    const n = Math.max(v.steps.length, 1);
    const lo = scope === "arena" ? 0 : v.focus_range[0];
    const hi = scope === "arena" ? v.arena_bytes : v.focus_range[1];
    const span = Math.max(hi - lo, 1);
    const X = (t) => left + (t / n) * pw;
    const Y = (o) => top + ((o - lo) / span) * H;
    const svg = s("svg", { viewBox: `0 0 ${W} ${top + H + bottom}`, class: "rnb-lifetime-svg", role: "img" });
    svg.append(s("rect", { x: left, y: top, width: pw, height: H, fill: "var(--rnb-panel, #f6f8fa)", rx: 4 }));
    for (const p of v.programs) {
      const x = X(p.start), w = X(p.end + 1) - X(p.start);
      svg.append(s("rect", { x, y: top, width: w, height: H, fill: "#ffffff", "fill-opacity": 0.55, stroke: "#e4e7ec", class: "rnb-svg-paper rnb-svg-grid" }));
      const fit = Math.floor(w / 6);
      svg.append(s("text", { x: x + 3, y: top - 8, "font-size": 12, fill: "#667085", class: "rnb-svg-ax" },
        p.name.length <= fit ? p.name : p.name.slice(0, Math.max(fit - 1, 1)) + "…"));
    }
    // y axis: a few byte offsets
    for (let k = 0; k <= 4; k++) {
      const o = lo + (span * k) / 4;
      svg.append(s("line", { x1: left - 4, x2: left, y1: Y(o), y2: Y(o), stroke: "#98a2b3", class: "rnb-svg-tick" }));
      svg.append(s("text", { x: left - 7, y: Y(o) + 3.5, "font-size": 12, fill: "#667085", class: "rnb-svg-ax", "text-anchor": "end" }, humanAxis(o, hi, span / 4)));
    }
    svg.append(s("text", { x: 12, y: top + H / 2, "font-size": 12, fill: "#667085", class: "rnb-svg-ax", "text-anchor": "middle", transform: `rotate(-90 12 ${top + H / 2})` },
      "offset in the arena"));
    // x axis
    const tickEvery = n > 60 ? 10 : 5;
    for (let t = 0; t < n; t += tickEvery) {
      svg.append(s("line", { x1: X(t + 0.5), x2: X(t + 0.5), y1: top + H, y2: top + H + 4, stroke: "#98a2b3", class: "rnb-svg-tick" }));
      svg.append(s("text", { x: X(t + 0.5), y: top + H + 15, "font-size": 12, fill: "#667085", class: "rnb-svg-ax", "text-anchor": "middle" }, t));
    }
    svg.append(s("text", { x: left + pw / 2, y: top + H + 29, "font-size": 12, fill: "#667085", class: "rnb-svg-ax", "text-anchor": "middle" },
      "tick: the step's timeline (the memory inspector's ticks) →"));

    const boxes = new Map();
    for (const t of tensors) {
      const list = [];
      for (const [a, b] of t.intervals) {
        const r = s("rect", {
          class: "rnb-life-box", x: X(a) + 0.5, y: Y(t.offset), width: Math.max(X(b + 1) - X(a) - 1, 2),
          height: Math.max(Y(t.offset + t.slot_bytes) - Y(t.offset), 2.5), fill: t.color, rx: 1.5,
          "data-tensor": t.name, "data-shared": t.shares.length ? 1 : 0,
        });
        const stepA = v.steps[a] || {}, stepB = v.steps[b] || {};
        r.addEventListener("mousemove", (ev) => {
          for (const x of boxes.get(t.id) || []) x.classList.add("rnb-hi");
          const friends = sharedWith.get(t.id) || [];
          showTip(ev, `<b>${esc(t.name)}</b> <span class="rnb-k">#${t.id}</span><br>`
            + `<span class="rnb-k">region</span>${esc(t.region)}<br>`
            + `<span class="rnb-k">shape</span>(${t.shape.join(", ")}) ${esc(t.dtype)}<br>`
            + `<span class="rnb-k">offset</span>${t.offset.toLocaleString()} · ${human(t.slot_bytes)}<br>`
            + `<span class="rnb-k">live</span>ticks ${a}–${b}` + (t.persistent ? " (kept across steps)" : "")
            + `<br><span class="rnb-k">read</span>at ${plural((t.reads || []).length, "tick")} · <span class="rnb-k">written</span>at ${plural((t.writes || []).length, "tick")}`
            + (stepA.op ? `<br><span class="rnb-k">from</span>${esc(stepA.op)} (${esc(stepA.layer)}, ${esc(stepA.gid)})` : "")
            + (stepB.op ? `<br><span class="rnb-k">to</span>${esc(stepB.op)} (${esc(stepB.layer)}, ${esc(stepB.gid)})` : "")
            + `<br><span class="rnb-k">bytes</span>` + (friends.length ? `shared with ${friends.map(esc).join(", ")}` : "its own, not shared"));
        });
        r.addEventListener("mouseleave", () => {
          for (const x of boxes.get(t.id) || []) x.classList.remove("rnb-hi");
          tip.style.display = "none";
        });
        list.push(r);
        svg.append(r);
      }
      // where the step touches it: writes dark, reads light (the optimizer, NaN check, clip and EMA too)
      const y0 = Y(t.offset), hh = Math.max(Y(t.offset + t.slot_bytes) - Y(t.offset), 2.5);
      for (const [steps, cls] of [[t.reads || [], "rnb-life-read"], [t.writes || [], "rnb-life-write"]]) {
        for (const k of steps) {
          svg.append(s("rect", { class: cls, x: X(k) + 0.5, y: y0, width: Math.max(X(k + 1) - X(k) - 1, 1.5), height: hh,
            "data-tensor": t.name, "data-step": k, "pointer-events": "none" }));
        }
      }
      boxes.set(t.id, list);
    }
    el.append(svg);

    const legend = h("div", { class: "rnb-legend" });
    for (const f of v.families || []) {  // one swatch per region family: the palette of every view
      legend.append(h("span", { "data-family": f.family, "data-bytes": f.bytes, title: f.regions.join(", ") + (f.note ? ` · ${f.note}` : "") },
        h("span", { class: "rnb-swatch", style: { background: f.color } }), h("b", {}, f.family), ` ${f.name} · ${f.human}`,
        f.note ? h("span", { class: "rnb-muted" }, ` (slots ${human(f.slots)})`) : ""));
    }
    legend.append(h("span", {}, "· bytes of the arena per family, as the region map counts them (slots: its tensors' own, "
      + "more where liveness reuse packs them) · hover a box for the tensor, its region, offset, bytes and the ops that open and close its lifetime"));
    el.append(legend);
    if (v.shared.length) {
      const list = h("div", { class: "rnb-row rnb-shared-list" }, h("span", { class: "rnb-muted" }, "sharing bytes:"));
      for (const p of v.shared.slice(0, 16)) {
        list.append(h("span", { class: "rnb-tensor", title: `${human(p.bytes)} in common` }, `${p.a} ⇄ ${p.b}`));
      }
      if (v.shared.length > 16) list.append(h("span", { class: "rnb-muted" }, `… ${v.shared.length - 16} more`));
      el.append(list);
    }
  }
  draw();
  exportBar(el, { name: "lifetimes", picture: () => el.querySelector(".rnb-lifetime-svg"),
    rows: () => lifetimeRows(model.get("view") || {}), data: () => {
      const v = model.get("view") || {};
      return v.ready ? { arena_bytes: v.arena_bytes, focus_range: v.focus_range, steps: v.steps, shared: v.shared,
        families: v.families, tensors: v.tensors } : { ready: false };
    } });
  model.on("change:view", draw);
  model.on("change:scope", draw);
  return () => { model.off("change:view", draw); model.off("change:scope", draw); tip.remove(); };
}

export default { render };
