// RegionMap: the arena to scale, one row per region with its tensors at their offsets,
// a hover card per tensor, a click on a region lists its DTensors, and a switch between
// the six variants (offsets stay; only the used part of each slot changes).

const MIN_ROW = 0.06;  // the shortest region row, as a share of the largest: a 48-region model's small ones stay visible
const shapeText = (s) => "(" + s.join(", ") + (s.length === 1 ? ",)" : ")");

function tooltip() {
  const tip = h("div", { class: "rnb-tip" });
  tip.style.display = "none";
  document.body.append(tip);
  return {
    show(ev, html) {
      tip.innerHTML = html;
      tip.style.display = "block";
      const pad = 14, r = tip.getBoundingClientRect();
      let x = ev.clientX + pad, y = ev.clientY + pad;
      if (x + r.width > window.innerWidth - 4) x = ev.clientX - r.width - pad;
      if (y + r.height > window.innerHeight - 4) y = ev.clientY - r.height - pad;
      tip.style.left = x + "px";
      tip.style.top = y + "px";
    },
    hide() { tip.style.display = "none"; },
    remove() { tip.remove(); },
  };
}

// The data of the export buttons: one row per tensor in the variant shown, and the regions they sit in.
function shownVariant(model) {
  const v = model.get("view") || {};
  return (v.variants || []).includes(model.get("variant")) ? model.get("variant") : (v.variants || [])[0];
}
function tensorRows(model) {
  const v = model.get("view") || {}, variant = shownVariant(model);
  if (!v.ready) return [];
  const family = new Map(v.regions.map((r) => [r.region, r.family]));
  return v.tensors.map((t) => ({ id: t.id, name: t.name, region: t.region, family: family.get(t.region), dtype: t.dtype,
    shape: (t.shapes[variant] || []).join("x"), offset: t.offset, slot_bytes: t.slot_bytes,
    bytes: t.nbytes[variant] ?? t.slot_bytes, variant }));
}
function regionData(model) {
  const v = model.get("view") || {};
  if (!v.ready) return { ready: false };
  return { variant: shownVariant(model), arena_bytes: v.arena_bytes, regions: v.regions.map((r) => ({ region: r.region,
    family: r.family, offset: r.base, bytes: r.size, tensors: r.tensor_ids.length })), families: v.families,
    tensors: tensorRows(model) };
}

const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

function render({ model, el }) {
  el.classList.add("rnb", "rnb-card", "rnb-region-map");
  liveView(model, el);
  const tip = tooltip();

  function tensorCard(t, variant) {
    const shape = t.shapes[variant] || [];
    const used = t.nbytes[variant];
    const stored = (t.storage || {})[variant] ?? used;  // data plus the padding of its rows
    return `<b>${esc(t.name)}</b> <span class="rnb-k">#${t.id}</span><br>`
      + `<span class="rnb-k">region</span>${esc(t.region)}<br>`
      + `<span class="rnb-k">shape</span>${esc(shapeText(shape))} ${esc(t.dtype)}<br>`
      + `<span class="rnb-k">offset</span>${t.offset.toLocaleString()} (0x${t.offset.toString(16)})<br>`
      + `<span class="rnb-k">bytes</span>${human(used)} used of a ${human(t.slot_bytes)} slot`
      + (t.reduced ? `<br><span class="rnb-k">ranks</span>all-reduced over the ranks every step` : "")
      + (t.pitch ? `<br><span class="rnb-k">rows</span>padded to ${t.pitch} elements (${human(stored - used)} of padding: rows 4 KiB apart alias in the cache)` : "")
      + (stored < t.slot_bytes ? `<br><span class="rnb-k"></span>${esc(variant)} leaves ${human(t.slot_bytes - stored)} unused` : "");
  }

  function draw() {
    const v = model.get("view") || {};
    el.replaceChildren();
    if (!v.ready) {
      el.append(h("div", { class: "rnb-title" }, "Memory"),
        h("div", { class: "rnb-note" }, "No memory plan yet: it is fixed by lock_memory() (or finalize_memory())."));
      return;
    }
    const variant = v.variants.includes(model.get("variant")) ? model.get("variant") : v.variants[0];
    const selected = model.get("selected_region");
    const byId = new Map(v.tensors.map((t) => [t.id, t]));

    // header: stats and the variant switch
    el.append(h("div", { class: "rnb-row" },
      h("div", { class: "rnb-grow" },
        h("div", { class: "rnb-title" }, "Arena"),
        h("div", { class: "rnb-sub" }, `${v.arena_human} in one allocation · ${plural(v.n_tensors, "tensor")} in ${plural(v.regions.length, "region")} · ${v.reuse_text}`)),
      h("span", { class: "rnb-stat" }, h("b", {}, v.arena_human), h("span", {}, "arena"))));
    if (v.empty_text) el.append(h("div", { class: "rnb-note rnb-empty-regions" }, v.empty_text));
    if (v.reduced_text) el.append(h("div", { class: "rnb-note rnb-reduced" }, v.reduced_text));
    if (v.variants.length > 1) {
      const seg = h("div", { class: "rnb-seg rnb-variant-switch" });
      for (const name of v.variants) {
        const info = v.variant_info[name] || {};
        seg.append(h("button", {
          class: (name === variant ? "rnb-on" : "") + (info.used === false ? " rnb-dim" : ""),
          "data-variant": name,
          title: `${name}: input ${info.input_shape}${info.used === false ? " (never runs for this data)" : ""}`,
          onclick: () => { model.set("variant", name); model.save_changes(); },
        }, name));
      }
      const ok = v.offsets_identical
        ? h("span", { class: "rnb-ok rnb-offsets-ok" }, `✓ ${v.offsets_text}`)
        : h("span", { class: "rnb-error" }, "offsets differ between variants");
      el.append(h("div", { class: "rnb-row", style: { margin: "4px 0 10px 0" } },
        h("span", { class: "rnb-muted" }, "variant"), seg, ok));
    }

    // the arena to scale
    const total = Math.max(v.arena_bytes, 1);
    const bar = h("div", { class: "rnb-arena-strip", style: { display: "flex", height: "30px", borderRadius: "7px", overflow: "hidden", background: "var(--rnb-panel)", position: "relative" } });
    let cursor = 0;
    for (const r of v.regions) {
      if (r.base > cursor) bar.append(h("div", { style: { flex: `0 0 ${((r.base - cursor) / total) * 100}%` } }));
      const seg = h("div", {
        class: "rnb-arena-seg" + (r.region === selected ? " rnb-selected" : ""), "data-region": r.region,
        style: { flex: `0 0 ${(r.size / total) * 100}%`, minWidth: "2px", background: r.color, color: inkOn(r.color), fontSize: "12px", fontWeight: 600, display: "flex", alignItems: "center", justifyContent: "center", borderRight: "1px solid rgba(255,255,255,.8)", cursor: "pointer", overflow: "hidden", boxShadow: r.region === selected ? "inset 0 0 0 2px var(--rnb-ink)" : "none" },
        onmousemove: (ev) => tip.show(ev, `<b>${esc(r.region)}</b><br><span class="rnb-k">family</span>${esc(r.family)} · ${esc(r.family_name)}<br><span class="rnb-k">offset</span>${r.base.toLocaleString()}<br><span class="rnb-k">size</span>${r.human} · ${plural(r.tensor_ids.length, "tensor")}`),
        onmouseleave: () => tip.hide(),
        onclick: () => select(r.region),
      }, (r.size / total) * 100 > 3.5 ? r.family : "");
      bar.append(seg);
      cursor = r.end;
    }
    const pic = h("div", { class: "rnb-region-picture" });  // what the export buttons draw
    el.append(pic);
    pic.append(bar, h("div", { class: "rnb-row rnb-muted", style: { justifyContent: "space-between", fontSize: "12px", margin: "2px 0 4px 0" } },
      h("span", {}, "offset 0"), h("span", {}, v.arena_human)));

    // legend by family
    const legend = h("div", { class: "rnb-legend" });
    for (const f of v.families) {
      legend.append(h("span", { "data-family": f.family, title: f.name },
        h("span", { class: "rnb-swatch", style: { background: f.color } }), h("b", {}, f.family), ` ${f.name} · ${f.human}`));
    }
    pic.append(legend);

    // one row per region: tensors at their offsets; a row's length is its region's size, against the largest
    pic.append(h("div", { class: "rnb-h" }, `Regions · tensors at their offsets in ${variant}; a row's length is its region's size (pale: slot bytes this variant leaves unused) · click a region`));
    const rows = h("div", { class: "rnb-region-rows" });
    const largest = Math.max(1, ...v.regions.map((r) => r.size));
    const small = v.regions.filter((r) => r.size / largest < MIN_ROW).length;
    for (const r of v.regions) {
      const track = h("div", {  // a region under MIN_ROW of the largest: drawn at MIN_ROW, outlined (the note says)
        class: "rnb-region-track" + (r.region === selected ? " rnb-selected" : "") + (r.size / largest < MIN_ROW ? " rnb-min-width" : ""),
        "data-region": r.region, style: { width: `${Math.max(r.size / largest, MIN_ROW) * 100}%` },
        onclick: () => select(r.region),
      });
      for (const id of r.tensor_ids) {
        const t = byId.get(id);
        const used = Math.min(1, (t.nbytes[variant] ?? t.slot_bytes) / Math.max(t.slot_bytes, 1));
        const box = h("div", {
          class: "rnb-tensor-box", "data-tensor": t.name, "data-tensor-id": t.id,
          style: { left: `${((t.offset - r.base) / Math.max(r.size, 1)) * 100}%`, width: `max(3px, calc(${(t.slot_bytes / Math.max(r.size, 1)) * 100}% - 1px))`, background: t.color + "55" },
          onmousemove: (ev) => tip.show(ev, tensorCard(t, variant)),
          onmouseleave: () => tip.hide(),
        }, h("div", { class: "rnb-used", style: { width: `${used * 100}%`, background: t.color } }));
        track.append(box);
      }
      rows.append(
        h("div", { class: "rnb-region-name" + (r.region === selected ? " rnb-selected" : ""), "data-region": r.region, onclick: () => select(r.region), title: r.family_name },
          h("span", { class: "rnb-swatch", style: { background: r.color } }), r.region,
          r.reduced ? h("span", { class: "rnb-reduced-mark", title: "all-reduced over the ranks every step" }, " ⇄") : ""),
        track,
        h("div", { class: "rnb-region-size", title: r.saved > 0 ? `its tensors' slots add up to ${human(r.size + r.saved)}; liveness reuse `
          + `puts those whose lifetimes never meet on the same bytes, saving ${human(r.saved)}` : "" },
          r.human + (r.saved > 0 ? ` (−${human(r.saved)} reused)` : "")));
    }
    pic.append(rows);
    if (small) {
      pic.append(h("div", { class: "rnb-muted rnb-min-note" }, `${plural(small, "region")} under ${MIN_ROW * 100}% of the largest `
        + `${small === 1 ? "is" : "are"} drawn at ${MIN_ROW * 100}% (dotted outline), so that ${small === 1 ? "its" : "their"} tensors stay visible; the true size is the number on the right.`));
    }
    if (v.regions.some((r) => r.saved > 0)) {
      pic.append(h("div", { class: "rnb-muted rnb-reuse-note" }, "(−n reused): bytes a region saves by liveness reuse: its tensors' "
        + "slots add up to more, and those whose lifetimes never meet share bytes. The family totals here and in the lifetimes count the region's bytes."));
    }

    // detail of the selected region
    const detail = h("div", { class: "rnb-detail rnb-region-detail", "data-region": selected || "" });
    const r = v.regions.find((x) => x.region === selected);
    if (r) {
      const t = h("table", { class: "rnb-table" }, h("tr", {},
        ...["id", "name", `shape (${variant})`, "dtype", "offset", "slot", "used"].map((s, i) => h("th", { class: i >= 4 ? "rnb-num" : "" }, s))));
      for (const id of r.tensor_ids) {
        const x = byId.get(id);
        t.append(h("tr", { "data-tensor": x.name },
          h("td", { class: "rnb-mono rnb-muted" }, "#" + x.id),
          h("td", { class: "rnb-mono" }, h("b", {}, x.name)),
          h("td", { class: "rnb-mono" }, shapeText(x.shapes[variant] || [])),
          h("td", { class: "rnb-mono" }, x.dtype),
          h("td", { class: "rnb-num rnb-mono" }, x.offset.toLocaleString()),
          h("td", { class: "rnb-num" }, human(x.slot_bytes)),
          h("td", { class: "rnb-num" }, human(x.nbytes[variant] ?? x.slot_bytes))));
      }
      detail.append(
        h("div", { class: "rnb-row" },
          h("span", { class: "rnb-swatch", style: { background: r.color } }),
          h("b", {}, r.region), h("span", { class: "rnb-muted" },
            `${r.family_name} · offset ${r.base.toLocaleString()}–${r.end.toLocaleString()} · ${r.human} · ${r.tensor_ids.length} DTensors`
            + (r.reusable ? " · liveness may pack it" : "")),
          h("span", { class: "rnb-grow" }),
          h("button", { class: "rnb-btn rnb-quiet", onclick: () => select("") }, "close")),
        t);
    } else {
      detail.append(h("span", { class: "rnb-muted" }, "Click a region (or its row) to list its DTensors."));
    }
    el.append(detail);
  }

  function select(region) {
    model.set("selected_region", model.get("selected_region") === region ? "" : region);
    model.save_changes();
  }

  draw();
  exportBar(el, { name: "region_map", picture: () => el.querySelector(".rnb-region-picture"),
    rows: () => tensorRows(model), data: () => regionData(model) });
  const events = ["change:view", "change:variant", "change:selected_region"];
  for (const e of events) model.on(e, draw);
  return () => { for (const e of events) model.off(e, draw); tip.remove(); };
}

export default { render };
