// Building DOM from data without innerHTML: every value lands in a text node or an attribute.

export const STATES = ["Ready", "Progressing", "AwaitingApproval", "Denied", "Degraded", "RolledBack", "Paused", "Stale"];
// The letters in the matrix cells: state is never told by colour alone.
export const STATE_CODES = {
  Ready: "R",
  Progressing: "P",
  AwaitingApproval: "AA",
  Denied: "DN",
  Degraded: "D",
  RolledBack: "RB",
  Paused: "PA",
  Stale: "S",
};

export function h(tag, attrs, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") element.className = value;
    else if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  add(element, children);
  return element;
}

// Replace an element's children (arrays flattened, null/false skipped, text as text nodes).
export function fill(element, ...children) {
  element.replaceChildren();
  add(element, children);
  return element;
}

function add(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
}

export function stateBadge(state) {
  return h("span", { class: `badge state s-${state}`, "data-state": state }, state);
}

export function resultBadge(result) {
  if (!result) return h("span", { class: "muted" }, "–");
  const kind = { Succeeded: "Ready", Failed: "Degraded", RolledBack: "RolledBack", Running: "Progressing" }[result];
  return h("span", { class: `badge state s-${kind || "Paused"}`, "data-result": result }, result);
}

export function link(href, ...children) {
  return h("a", { href, "data-nav": "" }, ...children);
}

export const pages = {
  matrix: (query) => (query && String(query) ? `/?${query}` : "/"),
  cluster: (cluster) => `/ui/clusters/${encodeURIComponent(cluster)}`,
  installation: (cluster, bundle) =>
    `/ui/installations/${encodeURIComponent(cluster)}/${encodeURIComponent(bundle)}`,
  rollouts: () => "/ui/rollouts",
  rollout: (id) => `/ui/rollouts/${encodeURIComponent(id)}`,
  enrollments: () => "/ui/enrollments",
};

const NUMBER = new Intl.NumberFormat("en-US");
export function count(n) {
  return NUMBER.format(n);
}

// "45s", "3m 10s", "2h 5m", "3d 4h".
export function age(seconds) {
  if (seconds === null || seconds === undefined) return "never";
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export function when(iso) {
  if (!iso) return h("span", { class: "muted" }, "–");
  return h("time", { datetime: iso }, String(iso).replace("T", " ").replace(/Z$/, " UTC"));
}

export function text(value) {
  return value === undefined || value === null || value === "" ? h("span", { class: "muted" }, "–") : String(value);
}

// A <dl> of [term, description] pairs.
export function facts(pairs) {
  return h("dl", { class: "facts" }, pairs.map(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]));
}

// A table with a caption, column headers and rows of cells (already nodes or text).
export function table(caption, headers, rows, attrs = {}) {
  return h(
    "table",
    attrs,
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, headers.map((title) => h("th", { scope: "col" }, title)))),
    h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((cell) => h("td", {}, cell))))),
  );
}
