// The fleet matrix: clusters (rows) × bundles (columns), a page at a time from /api/v1/matrix.
// Filters live in the URL query (linkable); refreshes patch the rows that changed.

import { getJSON } from "./api.js";
import { STATES, STATE_CODES, age, count, fill, h, link, pages } from "./dom.js";

const PAGE_SIZES = [50, 100, 200, 500];
const FILTERS = ["label", "bundle", "state", "name"];
let paintedOnce = false;

function readParams(url) {
  const query = url.searchParams;
  const params = {};
  for (const name of FILTERS) params[name] = (query.get(name) || "").trim();
  const size = Number(query.get("size"));
  params.size = PAGE_SIZES.includes(size) ? size : 100;
  params.page = Math.max(1, Math.floor(Number(query.get("page"))) || 1);
  return params;
}

function queryOf(params) {
  const query = new URLSearchParams();
  for (const name of FILTERS) if (params[name]) query.set(name, params[name]);
  if (params.page > 1) query.set("page", String(params.page));
  if (params.size !== 100) query.set("size", String(params.size));
  return query;
}

export function matrixView(url, navigate) {
  const params = readParams(url);
  const apply = (changes) => {
    const next = { ...params, page: 1, ...changes };
    navigate(pages.matrix(queryOf(next)));
  };

  // --- filters ---
  const labelInput = h("input", {
    id: "filter-label", name: "label", type: "search", list: "label-values", value: params.label,
    placeholder: "region=eu,tier!=edge", autocomplete: "off", spellcheck: "false",
  });
  const labelValues = h("datalist", { id: "label-values" });
  const bundleSelect = h("select", { id: "filter-bundle", name: "bundle" }, h("option", { value: "" }, "All bundles"));
  const stateSelect = h(
    "select", { id: "filter-state", name: "state" },
    h("option", { value: "" }, "Any state"),
    STATES.map((state) => h("option", { value: state, selected: state === params.state }, state)),
  );
  const nameInput = h("input", {
    id: "filter-name", name: "name", type: "search", value: params.name, autocomplete: "off", spellcheck: "false",
  });
  const form = h(
    "form", { class: "filters", role: "search", "aria-label": "Filter clusters" },
    h("div", { class: "field" }, h("label", { for: "filter-label" }, "Label selector"), labelInput, labelValues),
    h("div", { class: "field" }, h("label", { for: "filter-bundle" }, "Bundle"), bundleSelect),
    h("div", { class: "field" }, h("label", { for: "filter-state" }, "State"), stateSelect),
    h("div", { class: "field" }, h("label", { for: "filter-name" }, "Cluster name contains"), nameInput),
    h("div", { class: "field actions" },
      h("button", { type: "submit" }, "Apply filters"),
      link("/", "Clear filters")),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    apply({
      label: labelInput.value.trim(), bundle: bundleSelect.value, state: stateSelect.value, name: nameInput.value.trim(),
    });
  });
  bundleSelect.addEventListener("change", () => form.requestSubmit());
  stateSelect.addEventListener("change", () => form.requestSubmit());

  // --- summary, legend, table, pager ---
  const summary = h("p", { id: "matrix-summary", class: "summary" }, "Loading the fleet…");
  const counts = h("ul", { class: "counts", "aria-label": "Installations by state (click to filter)" });
  const legend = h(
    "p", { class: "legend", "aria-hidden": "true" },
    "Cells: ", STATES.map((state) => h("span", { class: "legend-item" },
      h("span", { class: `code s-${state}` }, STATE_CODES[state]), ` ${state}`)),
    h("span", { class: "legend-item" }, h("span", { class: "code none" }, "·"), " not installed"),
  );
  const headRow = h("tr");
  const body = h("tbody");
  const grid = h(
    "table", { id: "matrix", class: "matrix" },
    h("caption", { class: "sr-only" }, "Clusters by bundle: the state of each installation"),
    h("thead", {}, headRow), body,
  );
  const previous = h("button", { type: "button", onclick: () => apply({ ...params, page: params.page - 1 }) }, "Previous page");
  const next = h("button", { type: "button", onclick: () => apply({ ...params, page: params.page + 1 }) }, "Next page");
  const pageText = h("span", { id: "page-text", "aria-live": "polite" });
  const sizeSelect = h(
    "select", { id: "page-size", onchange: (event) => apply({ ...params, size: Number(event.target.value) }) },
    PAGE_SIZES.map((size) => h("option", { value: size, selected: size === params.size }, String(size))),
  );
  const pager = h(
    "nav", { class: "pager", "aria-label": "Pages of clusters" },
    previous, pageText, next, h("label", { for: "page-size" }, "Clusters per page"), sizeSelect,
  );
  const root = h(
    "section", { "aria-labelledby": "matrix-title" },
    h("h1", { id: "matrix-title" }, "Fleet matrix"),
    form, summary, counts, legend, h("div", { class: "table-wrap" }, grid), pager,
  );

  let columns = null;
  let rows = new Map(); // cluster -> {tr, signature, beat}

  function fillChoices(data) {
    const bundles = data.allBundles.includes(params.bundle) || !params.bundle
      ? data.allBundles : [...data.allBundles, params.bundle];
    const wanted = JSON.stringify(bundles);
    if (bundleSelect.dataset.options !== wanted) {
      bundleSelect.dataset.options = wanted;
      fill(bundleSelect,
        h("option", { value: "" }, "All bundles"),
        bundles.map((b) => h("option", { value: b, selected: b === params.bundle }, b)),
      );
    }
    const labels = Object.entries(data.labels).flatMap(([key, values]) => values.map((v) => `${key}=${v}`));
    if (labelValues.childElementCount !== labels.length) {
      fill(labelValues, ...labels.map((value) => h("option", { value })));
    }
  }

  function renderSummary(data) {
    const first = data.total ? data.offset + 1 : 0;
    const last = Math.min(data.offset + data.items.length, data.total);
    const filtered = FILTERS.some((name) => params[name]);
    fill(summary,
      `Clusters ${count(first)}–${count(last)} of ${count(data.total)}${filtered ? " matching" : ""}. `,
      h("span", { class: "muted" },
        `Fleet: ${count(data.fleet.clusters)} clusters, ${count(data.fleet.stale)} stale, `
        + `${count(data.fleet.errors)} with an unreadable status document.`),
    );
    fill(counts, ...STATES.map((state) => h(
      "li", {},
      h("button", {
        type: "button", class: "count", "data-state": state, "aria-pressed": String(params.state === state),
        onclick: () => apply({ state: params.state === state ? "" : state }),
      }, h("span", { class: `code s-${state}`, "aria-hidden": "true" }, STATE_CODES[state]),
      ` ${state} `, h("strong", {}, count(data.states[state]))),
    )));
    const pagesTotal = Math.max(1, Math.ceil(data.total / params.size));
    pageText.textContent = `Page ${count(params.page)} of ${count(pagesTotal)}`;
    previous.disabled = params.page <= 1;
    next.disabled = params.page >= pagesTotal;
  }

  function renderHead(bundles) {
    fill(headRow,
      h("th", { scope: "col", class: "name" }, "Cluster"),
      h("th", { scope: "col", class: "labels" }, "Labels"),
      h("th", { scope: "col", class: "beat" }, "Last heartbeat"),
      bundles.map((bundle) => h(
        "th", { scope: "col", class: "bundle", title: bundle },
        h("a", { href: pages.matrix(queryOf({ ...params, bundle, page: 1 })), "data-nav": "" }, h("span", {}, bundle)),
      )),
    );
  }

  function beatCell(row) {
    const cell = h("td", { class: "beat" });
    fillBeat(cell, row);
    return cell;
  }

  function fillBeat(cell, row) {
    fill(cell,
      row.stale ? h("span", { class: "badge stale-badge" }, "Stale") : null,
      row.heartbeat ? h("span", { title: row.heartbeat }, `${age(row.heartbeatAgeSeconds)} ago`) : "never",
      row.error ? h("span", { class: "badge error-badge", title: row.error }, "status error") : null,
    );
  }

  function buildRow(row) {
    const labels = Object.entries(row.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ");
    return h(
      "tr", { "data-cluster": row.name, class: row.stale ? "stale" : null },
      h("th", { scope: "row", class: "name" }, link(pages.cluster(row.name), row.name)),
      h("td", { class: "labels" }, labels),
      beatCell(row),
      columns.map((bundle) => {
        const state = row.cells[bundle];
        // Two nodes per cell (10,000 cells a page at most): the name for screen readers is
        // the link's aria-label, the letter is what the eye reads besides the colour.
        if (!state) {
          return h("td", { class: "cell none", "data-bundle": bundle, "data-state": "" },
            h("span", { role: "img", "aria-label": "not installed" }, "·"));
        }
        return h("td", { class: `cell s-${state}`, "data-bundle": bundle, "data-state": state },
          h("a", {
            href: pages.installation(row.name, bundle), "data-nav": "",
            title: `${row.name} / ${bundle}: ${state}`, "aria-label": state,
          }, STATE_CODES[state]));
      }),
    );
  }

  function renderRows(data) {
    const fresh = new Map();
    const ordered = data.items.map((row) => {
      const signature = JSON.stringify([row.cells, row.labels, row.stale, row.error, row.heartbeat === null]);
      const known = rows.get(row.name);
      if (known && known.signature === signature) {
        fillBeat(known.tr.cells[2], row); // only the age moved
        fresh.set(row.name, known);
        return known.tr;
      }
      const tr = buildRow(row);
      fresh.set(row.name, { tr, signature });
      return tr;
    });
    rows = fresh;
    fill(body, ...ordered);
    if (!data.items.length) {
      body.append(h("tr", {}, h("td", { colspan: columns.length + 3, class: "empty" }, "No cluster matches these filters.")));
    }
  }

  async function load() {
    const data = await getJSON("/matrix", {
      label: params.label, bundle: params.bundle, state: params.state, name: params.name,
      offset: (params.page - 1) * params.size, limit: params.size,
    });
    if (data.total && data.offset >= data.total) {
      // A page that no longer exists (the fleet shrank, a stale link): go to the last one.
      const lastPage = Math.ceil(data.total / params.size);
      navigate(pages.matrix(queryOf({ ...params, page: lastPage })), { replace: true });
      return;
    }
    fillChoices(data);
    renderSummary(data);
    if (JSON.stringify(data.bundles) !== JSON.stringify(columns)) {
      columns = data.bundles;
      rows = new Map();
      renderHead(columns);
    }
    renderRows(data);
    if (!paintedOnce) {
      paintedOnce = true;
      // Read by bench/dashboard.py: the first rows are in the DOM, then painted.
      performance.mark("fleetlet:matrix-rendered");
      requestAnimationFrame(() => setTimeout(() => {
        performance.mark("fleetlet:matrix-painted");
        document.documentElement.dataset.matrixPainted = "true";
      }, 0));
    }
  }

  return { title: "Fleet matrix", root, load };
}
