// Shared DOM helpers, prepended to every widget module by renaissance_nb.display._assets.esm():
// anywidget loads each module from a string, so widgets cannot import a sibling file.

const NS = "http://www.w3.org/2000/svg";

function h(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "style") Object.assign(e.style, v);
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== false && v != null) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c != null) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

// "1 tensor", "2 tensors", "1 entry" (many = "entries"): a count and a noun that agree.
const plural = (n, one, many = one + "s") => `${n} ${n === 1 ? one : many}`;

function s(tag, attrs = {}, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text != null) e.textContent = text;
  return e;
}
