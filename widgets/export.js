// Export, prepended to every widget module after dom.js (display/_assets.py): PNG and SVG of a view's
// picture, CSV and JSON of its data, as files the browser downloads. The SVG carries the computed styles
// (the theme's colours as shown), an HTML picture inside a foreignObject; the PNG is that SVG drawn on a
// canvas at twice the size.

const SVG_PROPS = ["fill", "fill-opacity", "stroke", "stroke-width", "stroke-opacity", "stroke-dasharray", "opacity",
  "font-size", "font-family", "font-weight", "text-anchor", "dominant-baseline", "visibility", "display"];
const HTML_PROPS = ["display", "box-sizing", "width", "height", "min-width", "margin", "padding", "border-top",
  "border-right", "border-bottom", "border-left", "border-radius", "background-color", "color", "font-family",
  "font-size", "font-weight", "font-style", "line-height", "text-align", "white-space", "vertical-align", "flex",
  "flex-direction", "flex-wrap", "align-items", "justify-content", "gap", "grid-template-columns", "position",
  "left", "top", "right", "bottom", "overflow", "opacity", "border-collapse", "border-spacing", "box-shadow",
  "text-transform", "letter-spacing", "font-variant-numeric", "outline", "z-index"];
const XHTML = "http://www.w3.org/1999/xhtml";

function inlineStyles(src, dst) {
  const a = [src, ...src.querySelectorAll("*")], b = [dst, ...dst.querySelectorAll("*")];
  a.forEach((e, i) => {
    const cs = getComputedStyle(e), props = e instanceof SVGElement ? SVG_PROPS : HTML_PROPS;
    b[i].setAttribute("style", props.map((p) => `${p}:${cs.getPropertyValue(p)}`).join(";"));
  });
}

function backgroundOf(node) {
  for (let e = node; e && e.nodeType === 1; e = e.parentElement) {
    const c = getComputedStyle(e).backgroundColor;
    if (c && c !== "transparent" && !/rgba\([^)]*,\s*0\)$/.test(c)) return c;
  }
  return "#ffffff";
}

// One element of the page as a standalone SVG document (text).
function pictureSvg(node) {
  const r = node.getBoundingClientRect(), w = Math.max(1, Math.ceil(r.width)), ht = Math.max(1, Math.ceil(r.height));
  const clone = node.cloneNode(true);
  inlineStyles(node, clone);
  const xml = new XMLSerializer();
  let body;
  if (node instanceof SVGSVGElement) {
    clone.setAttribute("width", w);
    clone.setAttribute("height", ht);
    body = xml.serializeToString(clone);
  } else {
    clone.style.margin = "0";
    const wrap = document.createElementNS(XHTML, "div");
    wrap.append(clone);
    body = `<foreignObject x="0" y="0" width="${w}" height="${ht}">${xml.serializeToString(wrap)}</foreignObject>`;
  }
  return `<svg xmlns="${NS}" width="${w}" height="${ht}" viewBox="0 0 ${w} ${ht}">`
    + `<rect width="100%" height="100%" fill="${backgroundOf(node)}"/>${body}</svg>`;
}

async function pngOf(svgText, scale = 2) {
  const img = new Image();
  img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svgText);
  await img.decode();
  const c = document.createElement("canvas");
  c.width = Math.ceil(img.width * scale);
  c.height = Math.ceil(img.height * scale);
  const ctx = c.getContext("2d");
  ctx.scale(scale, scale);
  ctx.drawImage(img, 0, 0);
  return new Promise((ok, fail) => c.toBlob((b) => (b ? ok(b) : fail(new Error("no PNG"))), "image/png"));
}

function csvText(rows) {
  const cols = [...new Set(rows.flatMap((r) => Object.keys(r)))];
  const q = (v) => {
    const t = v == null ? "" : typeof v === "object" ? JSON.stringify(v) : String(v);
    return /[",\n]/.test(t) ? `"${t.replace(/"/g, '""')}"` : t;
  };
  return [cols.join(","), ...rows.map((r) => cols.map((c) => q(r[c])).join(","))].join("\n") + "\n";
}

function download(name, blob) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 30000);
}

// The export buttons of a view, kept as its last child while it redraws. spec: { name, picture: () =>
// Element | null, rows: () => [{...}] (CSV), data: () => {...} (JSON) }; the data buttons only where given.
function exportBar(el, spec) {
  const act = async (kind, btn) => {
    const pic = spec.picture && spec.picture();
    try {
      if (kind === "svg" || kind === "png") {
        if (!pic) return;
        const svg = pictureSvg(pic);
        download(`${spec.name}.${kind}`, kind === "svg" ? new Blob([svg], { type: "image/svg+xml" }) : await pngOf(svg));
      } else if (kind === "csv") download(`${spec.name}.csv`, new Blob([csvText(spec.rows())], { type: "text/csv" }));
      else download(`${spec.name}.json`, new Blob([JSON.stringify(spec.data(), null, 1)], { type: "application/json" }));
      btn.removeAttribute("data-failed");
    } catch (e) {
      btn.dataset.failed = String(e && e.message ? e.message : e);
      btn.title = `could not export: ${btn.dataset.failed}`;
    }
  };
  const kinds = [["png", "PNG", "the picture as a PNG image"], ["svg", "SVG", "the picture as an SVG drawing"],
    ...(spec.rows ? [["csv", "CSV", "the data as a CSV table"]] : []), ...(spec.data ? [["json", "JSON", "the data as JSON"]] : [])];
  const bar = h("div", { class: "rnb-row rnb-export" }, h("span", { class: "rnb-muted" }, "export"),
    ...kinds.map(([k, label, title]) => h("button", { class: "rnb-btn rnb-quiet", "data-export": k, title,
      onclick: (e) => act(k, e.currentTarget) }, label)));
  const keep = () => { if (el.lastChild !== bar) el.append(bar); };
  keep();
  new MutationObserver(keep).observe(el, { childList: true });
  return bar;
}
