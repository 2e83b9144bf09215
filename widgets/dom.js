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

// Bytes as the widgets print them: "512 B", "1.5 KiB", "3.0 MiB" (text.human_bytes's units, one decimal).
function human(n) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${Math.round(n)} B` : `${n.toFixed(1)} ${units[i]}`;
}

// "1 tensor", "2 tensors", "1 entry" (many = "entries"): a count and a noun that agree.
const plural = (n, one, many = one + "s") => `${n} ${n === 1 ? one : many}`;

function s(tag, attrs = {}, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text != null) e.textContent = text;
  return e;
}

// Every live view: marked "rnb-live" (the static copy shown before it in a notebook then hides, see
// renaissance.css), and polling its task every 1.5 s while it is in the page, so it follows phase calls,
// runs, reset and load made anywhere (Python re-reads the task only when its mark changed).
function liveView(model, el) {
  el.classList.add("rnb-live");
  let seen = false, waited = 0;
  const timer = setInterval(() => {
    if (el.isConnected) {
      seen = true;
      if (!document.hidden) model.send({ poll: 1 });
    } else if (seen || (waited += 1) > 40) clearInterval(timer);
  }, 1500);
}
