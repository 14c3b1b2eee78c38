// The dashboard's shell: routing by path (History API, no full reloads), the token, the
// refresh loop (fetch every few seconds, views patch their DOM in place).

import { ApiError, takeTokenFromFragment, token } from "./api.js";
import { clusterView } from "./cluster.js";
import { h, link } from "./dom.js";
import { enrollmentsView } from "./enrollments.js";
import { installationView } from "./installation.js";
import { matrixView } from "./matrix.js";
import { rolloutView, rolloutsView } from "./rollouts.js";

const REFRESH_SECONDS = 5;

const main = document.getElementById("main");
const alertBox = document.getElementById("alert");
const tokenPanel = document.getElementById("token-panel");
const tokenMessage = document.getElementById("token-message");
const tokenForm = document.getElementById("token-form");
const tokenInput = document.getElementById("token-input");
const changeToken = document.getElementById("change-token");
const autoRefresh = document.getElementById("auto-refresh");
const updated = document.getElementById("updated");

let current = null;
let timer = null;

function route(url) {
  const path = url.pathname.replace(/\/+$/, "") || "/";
  const decode = decodeURIComponent;
  let match;
  if (path === "/" || path === "/ui") return matrixView(url, navigate);
  if ((match = path.match(/^\/ui\/clusters\/([^/]+)$/))) return clusterView(decode(match[1]));
  if ((match = path.match(/^\/ui\/installations\/([^/]+)\/([^/]+)$/))) {
    return installationView(decode(match[1]), decode(match[2]));
  }
  if (path === "/ui/rollouts") return rolloutsView();
  if (path === "/ui/enrollments") return enrollmentsView();
  if ((match = path.match(/^\/ui\/rollouts\/([^/]+)$/))) return rolloutView(decode(match[1]));
  return {
    title: "Not found",
    root: h("section", {}, h("h1", {}, "No such page"), h("p", {}, link("/", "Back to the fleet matrix"))),
    load: async () => {},
  };
}

function show() {
  clearTimeout(timer);
  current = route(new URL(location.href));
  document.title = `${current.title} · fleetlet`;
  main.replaceChildren(current.root);
  tick();
}

// Same-origin navigation without a reload: pushes the URL, builds the view.
export function navigate(href, { replace = false } = {}) {
  const url = new URL(href, location.href);
  if (replace) history.replaceState(null, "", url);
  else history.pushState(null, "", url);
  show();
}

let ticks = 0;

// Load the current view; then, unless a newer tick or another view took over, schedule the
// next one. One chain of timers whatever triggers a tick (timer, token, navigation).
async function tick() {
  clearTimeout(timer);
  const run = ++ticks;
  if (document.hidden) {
    schedule(run);
    return;
  }
  try {
    await current.load();
    if (run !== ticks) return;
    clearAlert();
    tokenPanel.hidden = true;
    changeToken.hidden = false;
    updated.textContent = `Updated ${new Date().toLocaleTimeString("en-GB")}`;
  } catch (error) {
    if (run !== ticks) return;
    if (!(error instanceof ApiError)) {
      console.error(error);
      showAlert(`Dashboard error: ${error.message}`);
    } else if (error.status === 401) {
      askForToken(error.withToken);
      return; // nothing to refresh until a token is given
    } else if (error.status === 0) {
      showAlert(`The hub did not answer; retrying every ${REFRESH_SECONDS} s. What is shown may be out of date.`);
    } else {
      showAlert(`${error.status === 404 ? "Not found" : "Error"}: ${error.message}`);
    }
  }
  schedule(run);
}

function schedule(run) {
  if (run !== ticks || !autoRefresh.checked) return;
  clearTimeout(timer);
  timer = setTimeout(tick, REFRESH_SECONDS * 1000);
}

function askForToken(sent) {
  showAlert(
    sent
      ? "Token invalid: the hub does not accept this token (HTTP 401). Enter a valid token."
      : "Token needed: this hub needs a bearer token to show the fleet. Enter one below.",
  );
  tokenMessage.textContent = sent
    ? "The token given is missing from the hub's tokens file. Ask for a read token."
    : "This hub needs a bearer token to show the fleet.";
  tokenPanel.hidden = false;
  changeToken.hidden = true;
  tokenInput.focus();
}

function showAlert(message) {
  alertBox.textContent = message;
  alertBox.hidden = false;
}

function clearAlert() {
  alertBox.hidden = true;
  alertBox.textContent = "";
}

tokenForm.addEventListener("submit", (event) => {
  event.preventDefault();
  const value = tokenInput.value.trim();
  if (!value) return;
  token.set(value);
  tokenInput.value = "";
  tokenPanel.hidden = true;
  tick();
});

document.getElementById("forget-token").addEventListener("click", () => {
  token.clear();
  tokenInput.value = "";
  tick();
});

changeToken.addEventListener("click", () => {
  tokenMessage.textContent = "Enter another bearer token for this hub.";
  tokenPanel.hidden = false;
  tokenInput.focus();
});

autoRefresh.addEventListener("change", () => {
  if (autoRefresh.checked) tick();
  else clearTimeout(timer);
});

document.addEventListener("visibilitychange", () => {
  if (!document.hidden && autoRefresh.checked) tick();
});

document.addEventListener("click", (event) => {
  const anchor = event.target.closest("a[data-nav]");
  if (!anchor || event.defaultPrevented || event.button !== 0) return;
  if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  const url = new URL(anchor.href, location.href);
  if (url.origin !== location.origin) return;
  event.preventDefault();
  navigate(url);
  main.focus({ preventScroll: true });
});

window.addEventListener("popstate", show);

takeTokenFromFragment();
show();
