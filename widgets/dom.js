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

const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];  // text.UNITS

// Bytes as the widgets print them: "512 B", "1.5 KiB", "3.0 MiB" (text.human_bytes's units and rounding, one
// decimal, an exact tie away from zero, as toFixed rounds it).
function human(n) {
  const units = BYTE_UNITS;
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${Math.round(n)} B` : `${n.toFixed(1)} ${units[i]}`;
}

// Bytes on an axis: the unit of the largest value, and the decimals that tell ticks ``step`` apart
// ("4.36 MiB", "4.38 MiB"), so an axis reads in human units, not as an offset from some byte.
function humanAxis(n, top, step) {
  const units = BYTE_UNITS;
  let i = 0, scale = 1;
  while (Math.abs(top) >= 1024 * scale && i < units.length - 1) { scale *= 1024; i++; }
  const digits = i === 0 ? 0 : Math.min(3, Math.max(0, Math.ceil(-Math.log10(Math.max(step, 1e-9) / scale))));
  return `${(n / scale).toFixed(digits)} ${units[i]}`;
}

// Near-black or white, whichever reads better on a background "#rrggbb" (WCAG relative luminance): the
// text of pills and bars coloured by family, stream or status stays at 4.5:1 or more.
function inkOn(bg) {
  const m = /^#?([0-9a-f]{6})$/i.exec(String(bg || "").trim());
  if (!m) return "#ffffff";
  const [r, g, b] = [0, 2, 4].map((i) => parseInt(m[1].slice(i, i + 2), 16) / 255)
    .map((c) => (c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4));
  const lum = 0.2126 * r + 0.7152 * g + 0.0722 * b;
  return (lum + 0.05) / 0.0625 >= 1.05 / (lum + 0.05) ? "#111111" : "#ffffff";  // against #111111 (lum 0.0056) or white
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
// renaissance.css), and following its task while it is in the page. The views of one task (one poll_key,
// display/peers.py) share one poll every 1.5 s, sent through one of them and naming all those shown, so
// Python re-reads the task once for all of them (and only when it moved on). The registry is global: each
// widget is a module of its own. No poll goes while the kernel is down, restarting or out of reach; they
// resume when it is back. A view whose model lost its kernel for good (a restart) stops, marked
// "rnb-detached", with no error in the console.
const POLL_MS = 1500;

function kernelUp(model) {
  const k = model.widget_manager && model.widget_manager.kernel;
  if (!k) return true;  // a front end that gives widgets no kernel: the send itself says
  if (k.isDisposed) return false;
  if (k.connectionStatus && k.connectionStatus !== "connected") return false;
  return !["dead", "restarting", "autorestarting", "starting", "terminating", "unknown"].includes(k.status);
}

function detach(member) {
  member.dead = true;
  member.el.classList.add("rnb-detached");
  member.el.title = "This view lost its kernel: run its cell again to follow the task.";
}

// Send a message through a view's model; false (and the view detached) when its comm is gone for good.
function sendSafe(member, msg) {
  try {
    member.model.send(msg);
    return true;
  } catch (e) {  // "Cannot send": the comm or kernel was disposed
    detach(member);
    return false;
  }
}

// A button's message: with its kernel gone, the view is marked detached instead of a console error.
function trySend(model, msg, el = null) {
  try {
    model.send(msg);
    return true;
  } catch (e) {
    if (el) detach({ el });
    return false;
  }
}

function pollTick(key, group) {
  const shown = [];
  for (const m of group.members) {
    if (m.dead) group.members.delete(m);
    else if (m.el.isConnected) { m.seen = true; shown.push(m); }
    else if (m.seen || Date.now() - m.born > 60000) group.members.delete(m);  // removed, or never shown
  }
  if (!group.members.size) { clearInterval(group.timer); globalThis.__rnbPolls.delete(key); return; }
  group.ticks += 1;
  if (document.hidden || !shown.length || !kernelUp(shown[0].model)) { group.skipped += 1; return; }
  const ids = shown.map((m) => m.model.get("view_id")).filter(Boolean);
  for (const m of shown) {
    if (sendSafe(m, { poll: 1, shown: ids })) {
      group.sent += 1;
      globalThis.__rnbPollsSent = (globalThis.__rnbPollsSent || 0) + 1;  // every poll of the page, kept after its group
      return;
    }
  }
}

// Keys: a view's keys never reach the notebook. Some front ends read keys before the page does (Notebook 7
// handles them at the document, in the capture phase, and takes the arrow keys even from a focused slider),
// so one listener on the window, ahead of them all, stops every key whose target is inside a view and hands
// it to that view: Enter in a field applies it (a "change"), "?" lists the view's keys, Esc closes the
// list, and the view's own keys (onKey) run. Typing in a field is the browser's default action: it still
// happens. Each widget module is its own module: the listener and its registry are global.
function keyboard(el, keys, onKey) {
  el.setAttribute("data-lm-suppress-shortcuts", "true");
  el.setAttribute("data-rnb-keys", "");
  if (!el.hasAttribute("tabindex")) el.tabIndex = -1;  // a click inside gives the view the keys
  let help = null;
  const close = () => { if (help) { help.remove(); help = null; } };
  const toggle = () => {
    if (help) { close(); return; }
    const rows = [...keys, ["?", "show or hide these keys"], ["Esc", "close this list"]];
    help = h("div", { class: "rnb-keys", role: "dialog", "aria-label": "keys" },
      h("div", { class: "rnb-h" }, "Keys"),
      h("table", { class: "rnb-table" }, ...rows.map(([k, what]) => h("tr", {}, h("td", {}, h("kbd", {}, k)), h("td", {}, what)))));
    el.prepend(help);
  };
  const field = (t) => t && t.matches && t.matches("input:not([type=checkbox]):not([type=range]):not([type=button]), select");
  const handle = (e) => {
    if (onKey && onKey(e)) return;
    if (e.key === "Enter" && field(e.target)) {
      e.preventDefault();
      e.target.dispatchEvent(new Event("change", { bubbles: true }));
    } else if (e.key === "?" && !field(e.target)) { e.preventDefault(); toggle(); }
    else if (e.key === "Escape" && help) { e.preventDefault(); close(); }
  };
  const roots = (globalThis.__rnbKeyRoots ??= new WeakMap());
  roots.set(el, handle);
  if (!globalThis.__rnbKeysListening) {
    globalThis.__rnbKeysListening = true;
    for (const type of ["keydown", "keyup", "keypress"]) {
      window.addEventListener(type, (e) => {
        const root = e.target && e.target.closest ? e.target.closest("[data-rnb-keys]") : null;
        const go = root && globalThis.__rnbKeyRoots.get(root);
        if (!go) return;
        e.stopPropagation();
        if (type === "keydown") go(e);
      }, true);
    }
  }
}

function liveView(model, el, keys = [], onKey = null) {
  el.classList.add("rnb-live");
  keyboard(el, keys, onKey);
  const polls = (globalThis.__rnbPolls ??= new Map());
  const key = model.get("poll_key") || `view-${Math.random().toString(36).slice(2)}`;
  let group = polls.get(key);
  if (!group) {
    group = { members: new Set(), ticks: 0, sent: 0, skipped: 0 };
    group.timer = setInterval(() => pollTick(key, group), POLL_MS);
    polls.set(key, group);
  }
  const member = { model, el, seen: false, dead: false, born: Date.now() };
  group.members.add(member);
  return member;
}
