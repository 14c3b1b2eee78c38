// One cluster: heartbeat, last accepted serial, last refusal, labels, its installations.

import { getJSON, segment } from "./api.js";
import { age, facts, fill, h, link, pages, resultBadge, stateBadge, table, text, when } from "./dom.js";

export function clusterView(name) {
  const content = h("div", {}, h("p", {}, "Loading…"));
  const root = h(
    "section", { "aria-labelledby": "cluster-title" },
    h("nav", { class: "crumbs", "aria-label": "Breadcrumb" }, link("/", "Fleet"), " › ", h("span", { "aria-current": "page" }, name)),
    h("h1", { id: "cluster-title" }, "Cluster ", h("span", { class: "mono" }, name)),
    content,
  );
  let shown = null;

  async function load() {
    const [cluster, installations] = await Promise.all([
      getJSON(`/clusters/${segment(name)}`),
      getJSON("/installations", { cluster: name }),
    ]);
    // Redraw only when something but the clock moved: keeps focus and selection.
    const { heartbeatAgeSeconds, ...rest } = cluster;
    const signature = JSON.stringify([rest, installations]);
    if (signature === shown) {
      content.querySelector("[data-field=age]").textContent = ageText(cluster);
      return;
    }
    shown = signature;
    fill(content, ...render(cluster, installations.items));
  }

  return { title: `Cluster ${name}`, root, load };
}

function ageText(cluster) {
  return cluster.heartbeat ? `${age(cluster.heartbeatAgeSeconds)} ago` : "never reported";
}

function render(cluster, items) {
  const labels = Object.entries(cluster.labels || {});
  const refusal = cluster.lastRefusal;
  return [
    facts([
      ["Reporting", cluster.stale
        ? h("span", { class: "badge stale-badge" }, "Stale: no heartbeat within the hub's limit")
        : h("span", { class: "badge state s-Ready" }, "Reporting")],
      ["Last heartbeat", [when(cluster.heartbeat), " (", h("span", { "data-field": "age" }, ageText(cluster)), ")"]],
      ["Last accepted serial", text(cluster.lastAcceptedSerial || null)],
      ["Agent version", text(cluster.agentVersion)],
      ["Notification channel", cluster.notifyChannel === "up"
        ? h("span", { class: "badge state s-Ready" }, "Up: told of moves at once")
        : cluster.notifyChannel === "down"
          ? h("span", { class: "badge state s-Degraded" }, "Down: polling, reconnecting")
          : h("span", { class: "muted" }, "none: this agent only polls")],
      ["Status sequence", text(cluster.sequence)],
      ["Labels", labels.length
        ? h("ul", { class: "chips" }, labels.map(([k, v]) => h("li", {}, `${k}=${v}`)))
        : h("span", { class: "muted" }, "none known")],
      cluster.error ? ["Status document error", h("span", { class: "error-text" }, cluster.error)] : null,
    ].filter(Boolean)),
    h("h2", {}, "Last refusal"),
    refusal
      ? facts([
        ["Reason", h("strong", {}, text(refusal.reason))],
        ["Message", text(refusal.message)],
        ["Refused commit", h("span", { class: "mono" }, text(refusal.commit))],
        ["At", when(refusal.at)],
      ])
      : h("p", { class: "muted" }, "None: the agent accepted every publication it was sent."),
    h("h2", {}, "Installations"),
    items.length
      ? table(
        `${items.length} installation${items.length === 1 ? "" : "s"} on ${cluster.name}`,
        ["Bundle", "Group", "State", "Applied serial", "Last run", "Result", "Last succeeded run", "Drift corrections"],
        items.map((i) => [
          link(pages.installation(i.cluster, i.bundle), i.bundle),
          text(i.group),
          stateBadge(i.state),
          text(i.appliedSerial),
          h("span", { class: "mono" }, text(i.lastRun && i.lastRun.id)),
          resultBadge(i.lastRun && i.lastRun.result),
          h("span", { class: "mono" }, text(i.lastSuccessfulRun)),
          String(i.driftCount || 0),
        ]),
        { id: "installations" },
      )
      : h("p", { class: "muted" }, "The agent reports no installation."),
  ];
}
