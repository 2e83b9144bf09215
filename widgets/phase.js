// PhaseView: the phase diagram (drawn by Python, display/static.py), what each phase allows,
// buttons that make the API calls, errors, and the history of transitions.

function render({ model, el }) {
  el.classList.add("rnb", "rnb-card", "rnb-phase-view");
  liveView(model, el);
  const diagram = h("div", { class: "rnb-phase-diagram-wrap" });
  const actions = h("div", { class: "rnb-row rnb-phase-actions" });
  const error = h("div", { class: "rnb-phase-error" });
  const history = h("div", { class: "rnb-phase-history" });
  el.append(
    h("div", { class: "rnb-title" }, "Phases"),
    h("div", { class: "rnb-sub" }, "A task moves one way: memory is laid out once, then graphs are bound, then it runs. "
      + "Each button makes the same call as the API."),
    diagram, actions, error, h("div", { class: "rnb-h" }, "History"), history);

  const confirm = h("div", { class: "rnb-confirm-wrap" });
  el.append(confirm);
  function confirmBox(a, go) {
    confirm.replaceChildren(h("div", { class: "rnb-confirm", "data-confirm": a.name },
      h("span", {}, a.confirm + " "),
      h("button", { class: "rnb-btn rnb-danger", "data-confirm-yes": a.name,
        onclick: () => { confirm.replaceChildren(); go(); } }, `yes, ${a.label}`),
      h("button", { class: "rnb-btn", "data-confirm-no": a.name, onclick: () => confirm.replaceChildren() }, "cancel")));
  }

  function draw() {
    const v = model.get("view") || {};
    el.dataset.phase = v.current || "";
    diagram.innerHTML = v.svg || "";
    actions.replaceChildren();
    const busy = model.get("busy");
    for (const a of v.actions || []) {
      const b = h("button", {
        class: "rnb-btn" + (a.next ? " rnb-primary" : ""), "data-action": a.name, title: a.doc,
        disabled: busy || !a.enabled,
        onclick: () => {
          // reset() throws away the plan, the weights and the history: ask first, saying what goes
          if (a.confirm) { confirmBox(a, () => trySend(model, { action: a.name }, el)); return; }
          trySend(model, { action: a.name }, el);
        },
      }, a.label);
      actions.append(b);
    }
    if (busy) actions.append(h("span", { class: "rnb-muted" }, "working…"));
    const err = model.get("error") || {};
    error.replaceChildren();
    if (err.message) {
      error.append(h("div", { class: "rnb-error", "data-error": err.type },
        h("b", {}, err.action ? `${err.type} from ${err.action}()` : err.type), err.message));
    }
    history.replaceChildren();
    const rows = v.history || [];
    if (!rows.length) {
      history.append(h("div", { class: "rnb-muted" }, "No transitions yet: the task was just created."));
    } else {
      const t = h("table", { class: "rnb-table rnb-history" },
        h("tr", {}, h("th", {}, "time"), h("th", {}, "call"), h("th", {}, "transition"), h("th", { class: "rnb-num" }, "took")));
      for (const r of rows) {
        t.append(h("tr", {},
          h("td", { class: "rnb-mono" }, r.at),
          h("td", { class: "rnb-mono" }, r.operation + "()"),
          h("td", {}, r.source === r.target ? h("span", { class: "rnb-muted" }, `within ${r.target}`)
            : [r.source + " → ", h("b", {}, r.target)]),
          h("td", { class: "rnb-num" }, (r.seconds * 1e3).toFixed(1) + " ms")));
      }
      history.append(t);
    }
  }
  draw();
  exportBar(el, { name: "phases", picture: () => el.querySelector(".rnb-phase-diagram"),
    rows: () => ((model.get("view") || {}).history || []).map((r) => ({ ...r })), data: () => model.get("view") || {} });
  model.on("change:view", draw);
  model.on("change:error", draw);
  model.on("change:busy", draw);
  return () => {
    model.off("change:view", draw);
    model.off("change:error", draw);
    model.off("change:busy", draw);
  };
}

export default { render };
