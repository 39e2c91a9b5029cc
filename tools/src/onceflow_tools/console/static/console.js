// The console's live parts: values pushed by server-sent events go into [data-field] elements
// with textContent only (keys and record ids are user data), and each action asks first.
"use strict";

function fieldValue(data, path) {
  return path.split(".").reduce((value, key) => (value == null ? undefined : value[key]), data);
}

function formatted(value, format) {
  if (value === null || value === undefined) return "–";
  if (Array.isArray(value)) return value.join(format === "errors" ? "; " : ", ");
  if (format === "percent") return (100 * value).toFixed(1) + "%";
  if (format === "time") return new Date(value).toISOString().replace("T", " ").replace("Z", " UTC");
  if (typeof value === "number") return Number.isInteger(value) ? value.toLocaleString("en") : value.toLocaleString("en", { maximumFractionDigits: 1 });
  return String(value);
}

function updateNode(element, node) {
  element.className = element.className.replace(/health-\S+/, "health-" + node.health);
  for (const field of element.querySelectorAll("[data-field]")) {
    const name = field.dataset.field;
    field.textContent = formatted(fieldValue(node, name), field.dataset.format || (name === "errors" ? "errors" : ""));
  }
}

function drawRates(history) {
  const svg = document.getElementById("rates");
  if (!svg || history.length < 2) return;
  const width = svg.width.baseVal.value, height = svg.height.baseVal.value;
  const t0 = history[0][0], span = Math.max(history[history.length - 1][0] - t0, 1);
  const max = Math.max(1, ...history.map((s) => Math.max(s[1], s[2])));
  const points = (column) => history.map((s) => `${((s[0] - t0) / span * width).toFixed(1)},${(height - 2 - s[column] / max * (height - 4)).toFixed(1)}`).join(" ");
  svg.querySelector(".in").setAttribute("points", points(1));
  svg.querySelector(".out").setAttribute("points", points(2));
  document.getElementById("rates-span").textContent = Math.round(span);
  document.getElementById("rates-max").textContent = formatted(max);
}

function follow(element) {
  const live = document.getElementById("live");
  live.textContent = "connecting…";
  const source = new EventSource(element.dataset.stream);
  source.onopen = () => { live.textContent = "live"; live.className = "live on"; };
  source.onerror = () => { live.textContent = "reconnecting…"; live.className = "live off"; };
  source.onmessage = (message) => {
    const data = JSON.parse(message.data);
    if (data.nodes) {  // the pipeline view
      for (const [name, node] of Object.entries(data.nodes)) {
        const nodeElement = element.querySelector(`[data-node="${CSS.escape(name)}"]`);
        if (nodeElement) updateNode(nodeElement, node);
      }
    } else if (data.node) {  // one service's page
      updateNode(element, data.node);
      drawRates(data.history);
    }
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  };
}

document.addEventListener("DOMContentLoaded", () => {
  for (const element of document.querySelectorAll("[data-stream]")) follow(element);
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }
});
