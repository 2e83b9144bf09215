// BluePrintView and VariantsView: Python renders the HTML (the same as their static copies); this
// module shows it and, like every view, polls the task while shown, so it follows plan(), a model
// changed before plan(), compile() and reset() (renaissance_nb/display/blueprint.py).

function render({ model, el }) {
  el.classList.add("rnb", "rnb-card", "rnb-html-view");
  liveView(model, el);
  const body = h("div");
  el.append(body);
  const draw = () => { body.innerHTML = (model.get("view") || {}).html || ""; };
  draw();
  exportBar(el, { get name() { return (model.get("view") || {}).name || "view"; }, picture: () => body });
  model.on("change:view", draw);
  return () => model.off("change:view", draw);
}

export default { render };
