// Text contrast measured from computed styles (WCAG 2 relative luminance), for tests/test_browser_theme.py.
// Every visible text of a root element -- HTML elements' own text nodes and SVG <text> -- against what is
// drawn under it: the stack at the text's centre (document.elementsFromPoint), background colours and SVG
// fills composited with their opacities onto the page's background. Disabled controls are left out (WCAG
// exempts inactive components). Returns [{text, ratio, fg, bg, px}] for every text measured.
(root) => {
  const parse = (c) => {
    const m = /rgba?\(([^)]+)\)/.exec(c || "");
    if (!m) return null;
    const p = m[1].split(/[\s,/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const lin = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
  const lum = (c) => 0.2126 * lin(c[0]) + 0.7152 * lin(c[1]) + 0.0722 * lin(c[2]);
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const over = (top, under) => [0, 1, 2].map((i) => top[i] * top[3] + under[i] * (1 - top[3])).concat([1]);
  const opacity = (e) => { let o = 1; for (; e && e.nodeType === 1; e = e.parentElement) o *= Number(getComputedStyle(e).opacity); return o; };
  const SHAPES = new Set(["rect", "polygon", "path", "circle", "ellipse"]);
  const layer = (e) => {
    const cs = getComputedStyle(e);
    let c = null;
    if (e instanceof SVGElement) {
      if (!SHAPES.has(e.tagName)) return null;
      c = parse(cs.fill);
      if (c) c[3] *= Number(cs.fillOpacity);
    } else c = parse(cs.backgroundColor);
    if (!c || c[3] === 0) return null;
    c[3] *= opacity(e);
    return c;
  };
  const page = parse(getComputedStyle(document.body).backgroundColor) || [255, 255, 255, 1];
  const base = page[3] < 1 ? over(page, [255, 255, 255, 1]) : page;
  const out = [];
  const texts = [];
  const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) if (n.textContent.trim()) texts.push(n);
  for (const node of texts) {
    const e = node.parentElement;
    if (!e || e.closest("button:disabled, select:disabled, input:disabled, title, style, script, .rnb-tip")) continue;
    const svgText = e.closest("text");
    const range = document.createRange();
    range.selectNodeContents(node);
    let rect = (svgText || range).getClientRects()[0];
    if (!rect || rect.width < 1 || rect.height < 1) continue;
    const cs = getComputedStyle(svgText || e);
    if (cs.visibility !== "visible") continue;
    if (rect.top < 0 || rect.bottom > innerHeight) { (svgText || e).scrollIntoView({ block: "center" }); rect = (svgText || range).getClientRects()[0]; }
    const x = rect.left + rect.width / 2, y = rect.top + rect.height / 2;
    // under the text: for SVG, what is drawn below its <text>; for HTML, its element's own background and below
    const own = svgText || e;
    const stack = document.elementsFromPoint(x, y).filter((el) => (svgText ? el !== own && !own.contains(el) : el === own || !own.contains(el)));
    if (!document.elementsFromPoint(x, y).includes(own)) continue;  // clipped (a scrolled box) or covered
    const layers = [];
    for (const el of stack) {
      const c = layer(el);
      if (c) { layers.push(c); if (c[3] >= 0.999) break; }
    }
    let bg = base;
    for (const c of layers.reverse()) bg = over(c, bg);
    let fg = parse(svgText ? cs.fill : cs.color);
    if (!fg) continue;
    fg = [...fg];
    fg[3] *= (svgText ? Number(cs.fillOpacity) : 1) * opacity(svgText || e);
    const shown = over(fg, bg);
    const m = svgText && svgText.getScreenCTM ? svgText.getScreenCTM() : null;
    const px = parseFloat(cs.fontSize) * (m ? Math.hypot(m.a, m.b) : 1);
    out.push({ text: node.textContent.trim().slice(0, 40), ratio: Math.round(ratio(shown, bg) * 100) / 100,
               fg: shown.slice(0, 3).map(Math.round), graph: !!e.closest(".rnb-graph-canvas"), bg: bg.slice(0, 3).map(Math.round), px: Math.round(px * 10) / 10 });
  }
  return out;
}
