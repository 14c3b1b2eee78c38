// Progressive rollouts: the list, and one rollout (its waves, clusters per verdict, why it
// halted, its events and clusters). Actions are the CLI's and the API's (admin tokens).

import { ApiError, getJSON, segment } from "./api.js";
import { count, facts, fill, h, link, pages, table, text, when } from "./dom.js";

// Rollout status and cluster verdicts on the dashboard's state colours (text says it too).
const STATUS_CLASS = {
  Progressing: "s-Progressing",
  WaitingForPromotion: "s-AwaitingApproval",
  Paused: "s-Paused",
  Halted: "s-Degraded",
  Completed: "s-Ready",
  Reverted: "s-RolledBack",
  Aborted: "s-Denied",
  Superseded: "s-Paused",
};
const VERDICT_CLASS = {
  passed: "s-Ready",
  pending: "s-Progressing",
  failed: "s-Degraded",
  held: "s-Paused",
  skipped: "s-Paused",
  reverting: "s-RolledBack",
  reverted: "s-RolledBack",
  releasing: "s-Progressing",
  released: "s-Ready",
};
const VERDICTS = ["held", "pending", "passed", "failed", "skipped", "reverting", "reverted"];

function statusBadge(status) {
  return h("span", { class: `badge ${STATUS_CLASS[status] || "s-Paused"}`, "data-status": status }, status);
}

function verdictBadge(verdict) {
  if (!verdict) return h("span", { class: "muted" }, "–");
  return h("span", { class: `badge ${VERDICT_CLASS[verdict] || "s-Paused"}`, "data-verdict": verdict }, verdict);
}

// "3 passed · 1 failed · 6 held": the non-zero counts, each named.
function counted(counts) {
  const parts = Object.entries(counts || {}).filter(([, n]) => n > 0);
  if (!parts.length) return h("span", { class: "muted" }, "none");
  return h(
    "span",
    { class: "verdict-counts" },
    parts.map(([verdict, n], i) => [
      i ? " · " : "",
      h("span", { "data-verdict": verdict }, h("strong", {}, count(n)), ` ${verdict}`),
    ]),
  );
}

// A bar of the wave's clusters by verdict (each segment titled; the counts are beside it).
function bar(counts, total) {
  const segments = VERDICTS.filter((v) => (counts || {})[v] > 0).map((v) =>
    h("span", {
      class: `segment ${VERDICT_CLASS[v]}`,
      title: `${counts[v]} ${v}`,
      "data-width": String(counts[v] / Math.max(1, total)),
    }),
  );
  const element = h("span", { class: "bar", "aria-hidden": "true" }, segments);
  // Widths through the CSSOM, not a style attribute (the content security policy forbids those).
  for (const segment of element.children) segment.style.width = `${Number(segment.dataset.width) * 100}%`;
  return element;
}

function missing(error) {
  return error instanceof ApiError && error.status === 404;
}

function notServed() {
  return h(
    "p",
    { class: "muted", id: "no-rollouts" },
    "This hub does not serve rollouts: start it with --fleet and the cluster-branch repository ",
    "(--cluster-repo, or shards.repo in fleet.yaml). See docs/rollouts.md.",
  );
}

export function rolloutsView() {
  const content = h("div", {}, h("p", {}, "Loading…"));
  const root = h("section", { "aria-labelledby": "rollouts-title" }, h("h1", { id: "rollouts-title" }, "Rollouts"), content);
  let shown = null;

  async function load() {
    let data;
    try {
      data = await getJSON("/rollouts");
    } catch (error) {
      if (!missing(error)) throw error;
      fill(content, notServed());
      return;
    }
    const signature = JSON.stringify(data);
    if (signature === shown) return;
    shown = signature;
    const controller = data.controller || {};
    fill(
      content,
      h(
        "p",
        { class: "muted" },
        controller.running
          ? `This hub runs the rollout controller (a step every ${controller.intervalSeconds} s, and after new reports).`
          : "This hub shows rollouts but does not step them (no signing configured): `fleetlet hub rollout step` does.",
        controller.lastError ? [" Last step failed: ", h("span", { class: "error-text" }, controller.lastError)] : null,
      ),
      data.items.length
        ? table(
          `${data.items.length} rollout${data.items.length === 1 ? "" : "s"}, newest first`,
          ["Rollout", "Group", "Status", "Wave", "Clusters", "Failed / budget", "By verdict", "Updated"],
          data.items.map((r) => [
            link(pages.rollout(r.id), h("span", { class: "mono" }, r.id)),
            text(r.group),
            statusBadge(r.status),
            text(r.currentWave),
            count(r.clusters),
            `${r.failures.count ?? "?"} / ${r.failures.budget}`,
            [bar(r.counts, r.clusters), " ", counted(r.counts)],
            when(r.updatedAt),
          ]),
          { id: "rollouts" },
        )
        : h("p", { class: "muted" }, "No rollout yet: a group with a rollout strategy starts one when `hub publish` changes it."),
    );
  }

  return { title: "Rollouts", root, load };
}

export function rolloutView(id) {
  const content = h("div", {}, h("p", {}, "Loading…"));
  const root = h(
    "section",
    { "aria-labelledby": "rollout-title" },
    h("nav", { class: "crumbs", "aria-label": "Breadcrumb" }, link(pages.rollouts(), "Rollouts"), " › ", h("span", { "aria-current": "page" }, id)),
    h("h1", { id: "rollout-title" }, "Rollout ", h("span", { class: "mono" }, id)),
    content,
  );
  let verdict = "";
  let shown = null;

  async function load() {
    let data;
    try {
      data = await getJSON(`/rollouts/${segment(id)}`, { verdict, limit: 200 });
    } catch (error) {
      if (!missing(error)) throw error;
      fill(content, error.message.includes("no rollout") ? h("p", {}, `No rollout ${id} on this hub.`) : notServed());
      return;
    }
    const signature = JSON.stringify(data);
    if (signature === shown) return;
    shown = signature;
    fill(content, ...render(data));
  }

  function render(r) {
    const s = r.strategy;
    const halt = r.halt;
    const filter = h(
      "select",
      {
        id: "verdict-filter",
        onchange: (event) => {
          verdict = event.target.value;
          shown = null;
          load();
        },
      },
      h("option", { value: "" }, "every verdict"),
      VERDICTS.map((v) => h("option", { value: v, selected: v === verdict }, v)),
    );
    return [
      facts([
        ["Status", statusBadge(r.status)],
        ["Group", text(r.group)],
        ["Current wave", text(r.currentWave)],
        ["Created", [when(r.createdAt), " by ", h("strong", {}, r.createdBy)]],
        ["From", h("span", { class: "mono" }, `${r.source.repo}@${r.source.commit.slice(0, 12)}`)],
        ["Clusters", [count(r.clusters), ": ", counted(r.counts)]],
        ["Failures", `${r.failures.count ?? "?"} of a budget of ${r.failures.budget} (maxFailures ${s.maxFailures})` +
          (r.failures.forgiven ? `; ${r.failures.forgiven} forgiven by a resume` : "")],
        ["Strategy", `maxUnavailable ${s.maxUnavailable}, soakTime ${s.soakTime}, progressDeadline ${s.progressDeadline}, onFailure ${s.onFailure}`],
      ]),
      halt
        ? h(
          "section",
          { class: "halt", id: "halt", "aria-labelledby": "halt-title" },
          h("h2", { id: "halt-title" }, r.status === "Reverted" ? "Why it halted and reverted" : "Why it halted"),
          h("p", {}, when(halt.at), ": ", h("strong", {}, halt.reason)),
          table(
            "Clusters that failed",
            ["Cluster", "Why"],
            Object.entries(halt.failures).map(([cluster, why]) => [link(pages.cluster(cluster), cluster), why]),
            { id: "halt-failures" },
          ),
        )
        : null,
      h("h2", {}, "Waves"),
      table(
        `${r.waves.length} waves, in order`,
        ["Wave", "Gate", "Started", "Settled", "Clusters", "By verdict"],
        r.waves.map((w) => [
          h("strong", {}, w.name),
          w.pauseBefore
            ? (w.promotedBy ? ["promoted by ", h("strong", {}, w.promotedBy)] : "waits for promote")
            : h("span", { class: "muted" }, "–"),
          when(w.startedAt),
          when(w.settledAt),
          count(w.clusters),
          [bar(w.counts, w.clusters), " ", counted(w.counts)],
        ]),
        { id: "waves" },
      ),
      h("h2", {}, "Clusters"),
      h("p", {}, h("label", { for: "verdict-filter" }, "Verdict "), filter, " ",
        h("span", { class: "muted" }, `${count(r.members.total)} clusters${r.members.total > r.members.items.length ? `, the first ${r.members.items.length} shown` : ""}`)),
      table(
        "Member clusters",
        ["Cluster", "Wave", "Phase", "Serial", "Verdict", "Why"],
        r.members.items.map((m) => [
          link(pages.cluster(m.cluster), m.cluster),
          m.wave,
          m.phase,
          text(m.serial),
          verdictBadge(m.verdict),
          text(m.reason),
        ]),
        { id: "members" },
      ),
      h("h2", {}, "Events"),
      table(
        "What happened, newest last: who and when (also in git: refs/fleetlet/rollouts)",
        ["At", "By", "Action", "Wave", "Message"],
        r.events.map((e) => [when(e.at), h("strong", {}, e.by), e.action, text(e.wave), e.message]),
        { id: "events" },
      ),
    ];
  }

  return { title: `Rollout ${id}`, root, load };
}
