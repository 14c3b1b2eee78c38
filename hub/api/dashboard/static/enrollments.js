// Enrollment requests (`hub serve --enroll`): pending, accepted and denied, with what each
// cluster claimed and reported. Decisions are the CLI's and the API's (admin tokens).

import { ApiError, getJSON } from "./api.js";
import { count, fill, h, table, text, when } from "./dom.js";

const STATES = ["pending", "accepted", "denied"];
// On the dashboard's state colours (the text says it too).
const STATE_CLASS = { pending: "s-AwaitingApproval", accepted: "s-Ready", denied: "s-Denied" };

function badge(state, pendingMerge) {
  // Accepted onto a branch of its own (commit: branch): in the fleet once the operator merges it.
  const shown = pendingMerge ? `${state} (pending merge)` : state;
  const kind = pendingMerge ? "s-AwaitingApproval" : STATE_CLASS[state] || "s-Paused";
  return h("span", { class: `badge ${kind}`, "data-state": state }, shown);
}

function labels(map) {
  const pairs = Object.entries(map || {}).sort(([a], [b]) => a.localeCompare(b));
  return pairs.length ? pairs.map(([k, v]) => `${k}=${v}`).join(", ") : text("");
}

function notServed() {
  return h(
    "p",
    { class: "muted", id: "no-enrollment" },
    "This hub does not take enrollment requests: start it with --enroll ENROLL_DIR. ",
    "See docs/operations.md, \"Enrollment\".",
  );
}

export function enrollmentsView() {
  let state = "";
  let items = null;
  const summary = h("p", { id: "enrollment-counts" });
  const listing = h("div", { id: "enrollments" });
  const filter = h(
    "select",
    {
      id: "enrollment-filter",
      onchange: (event) => {
        state = event.target.value;
        render();
      },
    },
    h("option", { value: "" }, "every state"),
    STATES.map((s) => h("option", { value: s }, s)),
  );
  const content = h("div", {});
  const root = h(
    "section",
    { "aria-labelledby": "enrollments-title" },
    h("h1", { id: "enrollments-title" }, "Enrollment requests"),
    content,
  );

  function render() {
    if (items === null) return;
    const counts = Object.fromEntries(STATES.map((s) => [s, items.filter((r) => r.state === s).length]));
    fill(
      summary,
      STATES.map((s, i) => [i ? " · " : "", h("span", { "data-count": s }, h("strong", {}, count(counts[s])), ` ${s}`)]),
    );
    const rows = items
      .filter((r) => !state || r.state === state)
      .map((r) => [
        h("span", { "data-cluster": r.cluster }, r.cluster),
        badge(r.state, r.pendingMerge),
        text(r.token),
        labels(r.labels),
        text((r.facts || {}).kubernetesVersion),
        when(r.requestedAt),
        r.decidedBy ? [text(r.decidedBy), " ", when(r.decidedAt)] : text(""),
        text(r.reason || r.waiting || (r.pendingMerge ? `merge branch ${r.inventoryBranch}` : "")),
      ]);
    fill(
      listing,
      rows.length
        ? table(
            "Enrollment requests",
            ["Cluster", "State", "Token", "Labels", "Kubernetes", "Requested", "Decided", "Why"],
            rows,
          )
        : h("p", { class: "muted" }, state ? `No ${state} request.` : "No enrollment request yet."),
    );
  }

  async function load() {
    let data;
    try {
      data = await getJSON("/enrollments");
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) {
        fill(content, notServed());
        return;
      }
      throw error;
    }
    if (!content.contains(listing)) {
      fill(
        content,
        h("p", { class: "muted" }, "Clusters asking to join with a bootstrap token. Accept or deny a pending one with ",
          h("code", {}, "fleetlet hub clusters accept|deny NAME"), " (an admin token)."),
        h("p", { class: "filters" }, h("label", { for: "enrollment-filter" }, "State "), filter),
        summary,
        listing,
      );
    }
    items = data.items;
    render();
  }

  return { title: "Enrollments", root, load };
}
