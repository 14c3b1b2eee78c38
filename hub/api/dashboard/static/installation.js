// One installation (cluster × bundle): conditions, outputs of the latest succeeded run, runs.
// Sensitive outputs are shown as the API returns them for this token (`<sensitive>` for read
// tokens) with a visible marker.

import { getJSON, segment } from "./api.js";
import { facts, fill, h, link, pages, resultBadge, stateBadge, table, text, when } from "./dom.js";

const MASKED = "<sensitive>";

export function installationView(cluster, bundle) {
  const content = h("div", {}, h("p", {}, "Loading…"));
  const root = h(
    "section", { "aria-labelledby": "installation-title" },
    h("nav", { class: "crumbs", "aria-label": "Breadcrumb" },
      link("/", "Fleet"), " › ", link(pages.cluster(cluster), cluster), " › ",
      h("span", { "aria-current": "page" }, bundle)),
    h("h1", { id: "installation-title" }, "Installation ", h("span", { class: "mono" }, `${cluster}/${bundle}`)),
    content,
  );
  let shown = null;
  let why = null;

  function show(detail) {
    const signature = JSON.stringify([detail, why]);
    if (signature === shown) return; // keeps open <details>, focus and selection
    shown = signature;
    fill(content, ...explanation(why), ...render(detail));
  }

  async function load() {
    // Why it is not running the latest (`fleetlet explain`): shown when it arrives; the page
    // does not wait for it, nor fails without it.
    const asked = getJSON(`/explain/${segment(cluster)}`, { bundle }).catch(() => null);
    const detail = await getJSON(`/installations/${segment(cluster)}/${segment(bundle)}`);
    show(detail);
    why = await asked;
    show(detail);
  }

  return { title: `Installation ${cluster}/${bundle}`, root, load };
}

export function outputValue(output) {
  if (output.omitted) {
    return [h("span", { class: "muted" }, "(omitted: the agent has no hub key)"), " ", h("span", { class: "badge masked" }, "omitted")];
  }
  if (output.sensitive && output.value === MASKED) {
    return [h("code", { class: "value" }, MASKED), " ", h("span", { class: "badge masked", title: "Sensitive: only admin tokens see the value" }, "masked")];
  }
  if (output.sensitive) {
    const shown = [h("code", { class: "value" }, String(output.value)), " ", h("span", { class: "badge sensitive", title: "Sensitive value, shown to an admin token" }, "sensitive")];
    if (output.sealedBy === "anyone") {
      // Sealed without the agent's sealing key: anybody with the hub's public key could have.
      shown.push(" ", h("span", { class: "badge masked", title: "Not sealed with this cluster's agent key: not proof that the agent produced it" }, "unverified sender"));
    }
    return shown;
  }
  return h("code", { class: "value" }, String(output.value));
}

function outputsTable(caption, outputs, id) {
  return table(
    caption,
    ["Output", "Value"],
    outputs.map((o) => [h("span", { class: "mono" }, o.name), outputValue(o)]),
    { id, class: "outputs" },
  );
}

function render(d) {
  const runs = d.runs || [];
  const latest = runs.find((r) => r.id === d.lastSuccessfulRun);
  const health = d.health || {};
  const revision = (r) => (r ? `serial ${r.serial}` : null);
  return [
    facts([
      ["State", stateBadge(d.state)],
      ["Group", text(d.group)],
      ["Applied revision", text(revision(d.appliedRevision))],
      ["Last healthy revision", text(revision(d.lastHealthyRevision))],
      ["Health", [text(health.status), health.message ? ` – ${health.message}` : ""]],
      ["Drift corrections", String(d.driftCount || 0)],
      ["Last succeeded run", h("span", { class: "mono" }, text(d.lastSuccessfulRun))],
    ]),
    ...approvals(d.requests || []),
    h("h2", {}, "Conditions"),
    (d.conditions || []).length
      ? table(
        "Conditions reported by the agent",
        ["Type", "Status", "Reason", "Message", "Last transition"],
        d.conditions.map((c) => [h("strong", {}, text(c.type)), text(c.status), text(c.reason), text(c.message), when(c.lastTransitionTime)]),
        { id: "conditions" },
      )
      : h("p", { class: "muted" }, "No conditions reported."),
    h("h2", {}, "Outputs"),
    latest && latest.outputs.length
      ? outputsTable(`Outputs of ${latest.id}, the latest succeeded run`, latest.outputs, "outputs")
      : h("p", { class: "muted" }, latest ? "The latest succeeded run has no outputs." : "No succeeded run yet: no outputs."),
    h("h2", {}, "Runs"),
    runs.length
      ? h("table", { id: "runs", class: "runs" },
        h("caption", {}, `${runs.length} run${runs.length === 1 ? "" : "s"}, newest first`),
        h("thead", {}, h("tr", {}, ["Run", "Operation", "Serial", "Result", "Started", "Finished", "Objects", "Message", "Outputs"].map((t) => h("th", { scope: "col" }, t)))),
        h("tbody", {}, runs.map(runRow)))
      : h("p", { class: "muted" }, "No runs reported."),
  ];
}

// The first thing that keeps the latest away (the same answer as `fleetlet explain`), its
// details and the command that would unblock it; or that nothing does.
function explanation(why) {
  if (!why) return [];
  const reason = why.reason;
  const ok = (why.findings || []).find((f) => f.check === "ok" || f.check === "moving");
  const shown = reason || ok;
  if (!shown) return [];
  return [h(
    "section", { id: "explain", class: "explain", "data-check": shown.check, "data-blocked": String(why.blocked), "aria-label": "Why" },
    h("h2", {}, why.blocked ? "Why it is not running the latest" : "Up to date"),
    h("p", {}, h("strong", {}, shown.summary)),
    (shown.details || []).length ? h("ul", {}, shown.details.map((d) => h("li", {}, d))) : null,
    shown.unblock ? h("p", {}, "To unblock: ", h("code", {}, shown.unblock)) : null,
  )];
}

// Approval requests of the installation's group: the pending one first, with its preview
// (objects and security findings) so a reviewer sees what approving it would do.
function approvals(requests) {
  if (!requests.length) return [];
  return [
    h("h2", {}, "Approvals"),
    h("div", { id: "requests", class: "requests" }, requests.map(requestView)),
  ];
}

const STATE_OF_REQUEST = { Pending: "AwaitingApproval", Approved: "Ready", Denied: "Denied", Superseded: "Paused" };

function requestView(r) {
  const p = r.preview || {};
  const security = p.security || {};
  const counts = `${p.created || 0} created, ${p.changed || 0} changed, ${p.deleted || 0} deleted, ${p.unchanged || 0} unchanged`
    + (p.refused ? `, ${p.refused} refused by the dry run` : "");
  const decided = r.decidedBy
    ? [`${r.state} by `, h("span", { class: "mono" }, r.decidedBy), " ", when(r.decidedAt),
      r.policy ? ` (ApprovalPolicy ${r.policy}, rule ${r.rule})` : "", r.reason ? ` – ${r.reason}` : ""]
    : r.state === "Pending" ? `waiting: fleetlet preview ${r.name}, then fleetlet approve or deny` : r.state;
  const findings = ["rbac", "crds", "webhooks", "privileged", "namespaces"].flatMap((category) =>
    (security[category] || []).map((f) => h("li", { "data-category": category },
      h("strong", {}, category), ` ${f.bundle}: ${f.object} (${f.action}): ${(f.details || []).join("; ")}`)));
  const objects = p.objects || [];
  return h(
    "section", { class: "request", "data-request": r.name, "data-state": r.state, "aria-label": `Request ${r.name}` },
    h("h3", {}, h("span", { class: "mono" }, r.name), " ",
      h("span", { class: `badge state s-${STATE_OF_REQUEST[r.state] || "Paused"}` }, r.state)),
    facts([
      ["Serial", String(r.serial)],
      ["Decision", decided],
      ["Objects", counts],
      ["Security findings", String(p.findings || 0)],
    ]),
    findings.length ? h("ul", { class: "findings" }, findings) : null,
    objects.length
      ? h("details", {}, h("summary", {}, `${objects.length} object${objects.length === 1 ? "" : "s"}${p.omitted ? ` (and ${p.omitted} more)` : ""}`),
        table(`Objects request ${r.name} changes`, ["Action", "Bundle", "Object", "Fields"],
          objects.map((o) => [text(o.action), text(o.bundle),
            h("span", { class: "mono" }, `${o.kind} ${o.namespace ? `${o.namespace}/` : ""}${o.name}`),
            text((o.paths || []).join(", "))]), { class: "request-objects" }))
      : null,
  );
}

function runRow(run) {
  const counts = run.counts || {};
  const objects = ["created", "configured", "unchanged", "pruned"]
    .map((k) => `${counts[k] || 0} ${k}`).join(", ");
  const outputs = run.outputs || [];
  return h(
    "tr", { "data-run": run.id, "data-result": run.result },
    h("th", { scope: "row", class: "mono" }, run.id),
    h("td", {}, text(run.operation)),
    h("td", {}, text(run.serial)),
    h("td", {}, resultBadge(run.result)),
    h("td", {}, when(run.startedAt)),
    h("td", {}, when(run.finishedAt)),
    h("td", { class: "counts-cell" }, objects),
    h("td", { class: "message" }, text(run.message),
      run.failedObject ? h("div", { class: "failed" }, "Failed object: ", h("span", { class: "mono" }, run.failedObject)) : null),
    h("td", {}, outputs.length
      ? h("details", {}, h("summary", {}, `${outputs.length} output${outputs.length === 1 ? "" : "s"}`),
        outputsTable(`Outputs of run ${run.id}`, outputs, null))
      : h("span", { class: "muted" }, "none")),
  );
}
