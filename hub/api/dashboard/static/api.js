// The hub's API, as the CLI reads it: /api/v1/..., a bearer token on every call.

const TOKEN_KEY = "fleetlet.token";
const API = "/api/v1";

export class ApiError extends Error {
  // status 0: the hub did not answer. withToken: whether a token was sent (for 401s).
  constructor(status, message, withToken) {
    super(message);
    this.status = status;
    this.withToken = withToken;
  }
}

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

// A link such as http://hub/#token=... (what `fleetlet demo` prints): keep the token for this
// tab and take it out of the address bar, so it is neither bookmarked nor shown on screen.
export function takeTokenFromFragment() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  if (!fragment.has("token")) return;
  const value = fragment.get("token").trim();
  if (value) token.set(value);
  fragment.delete("token");
  const rest = fragment.toString();
  history.replaceState(history.state, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
}

export function segment(text) {
  return encodeURIComponent(text);
}

export async function getJSON(path, query = {}) {
  const url = new URL(API + path, location.origin);
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, String(value));
  }
  const secret = token.get();
  const headers = { Accept: "application/json" };
  if (secret) headers.Authorization = `Bearer ${secret}`;
  let response;
  try {
    response = await fetch(url, { headers, cache: "no-store" });
  } catch {
    throw new ApiError(0, "the hub did not answer", Boolean(secret));
  }
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok) {
    const message = (body && body.error) || `${response.status} ${response.statusText}`;
    throw new ApiError(response.status, message, Boolean(secret));
  }
  return body;
}
