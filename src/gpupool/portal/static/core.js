// What every page of the portal shares: the API call (the browser's session cookie signs it in; a change echoes
// the CSRF cookie), the guard against drawing a page the user has left, and escaping.
// Everything shown that came from a user goes through text nodes or esc(), never raw HTML.

export const main = document.getElementById("main");
export const state = { me: null, timer: null, view: 0, signedOut: () => {} };
export const TERMINAL = ["succeeded", "failed", "cancelled"];
export const QUEUED = ["pending", "preempted", "suspended"];

// Bumped on every route: a page whose data arrives after the user has moved on must not draw over the new page.
export class Stale extends Error {}
export function show(mine, ...nodes) { if (mine !== state.view) throw new Stale("moved on"); main.replaceChildren(...nodes); }

export const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
export const fmt = (x, d = 2) => Number(x ?? 0).toFixed(d);
export const age = (t) => { const s = Math.max(0, Math.round(Date.now() / 1000 - t)); return s >= 3600 ? `${Math.floor(s / 3600)}h` : s >= 60 ? `${Math.floor(s / 60)}m` : `${s}s`; };
export function el(html) { const t = document.createElement("template"); t.innerHTML = html.trim(); return t.content.firstElementChild; }

// The CSRF token the server set beside the HttpOnly session cookie; a page of another site can make the browser
// send the cookies, but cannot read this one to echo it.
export function csrf() { const m = document.cookie.match(/(?:^|;\s*)gpupool_csrf=([^;]*)/); return m ? decodeURIComponent(m[1]) : ""; }

// A fetch signed in by the session cookie; any method but GET carries the CSRF header.
export async function call(path, opts = {}) {
  const method = (opts.method || "GET").toUpperCase();
  const headers = { ...(method === "GET" ? {} : { "X-CSRF-Token": csrf() }), ...(opts.headers || {}) };
  const res = await fetch(path, { ...opts, method, headers, credentials: "same-origin" });
  if (res.status === 401) { state.signedOut(); throw new Error("signed out"); }
  return res;
}

export async function reasonOf(res) {
  try { const j = await res.json(); return Array.isArray(j.detail) ? j.detail.map((e) => `${e.loc.slice(1).join(".")}: ${e.msg}`).join("; ") : j.detail; } catch (e) { return res.statusText; }
}

export async function api(path, opts = {}) {
  const body = opts.body === undefined ? undefined : JSON.stringify(opts.body);
  const res = await call(path, { ...opts, body, headers: body ? { "Content-Type": "application/json" } : {} });
  if (!res.ok) throw new Error(await reasonOf(res));
  const type = res.headers.get("content-type") || "";
  return type.includes("json") ? res.json() : res.text();
}

export const q = encodeURIComponent;
export const ref = (w) => `/api/v1/workloads/${q(w.name)}?project=${q(w.project)}`;
export const pageOf = (w) => `#/workloads/${q(w.project)}/${q(w.name)}`;
// An app is opened through the portal's own host, which signs the browser in to the apps host (where apps_url
// sets one) with a single-use ticket; the address it lands on is describe's url.
export const viaPortal = (url) => { const u = new URL(url, location.href); return location.origin + u.pathname + u.search; };

// A server message with `--flags` in backticks: the flags as code, every part a text node.
export function flagged(message) {
  const out = document.createDocumentFragment();
  String(message).split("`").forEach((part, i) => {
    if (!part) return;
    if (i % 2 === 0) { out.append(document.createTextNode(part)); return; }
    const code = document.createElement("code");
    code.textContent = part;
    out.append(code);
  });
  return out;
}

// Right-sizing advice from its telemetry (the server's rule: gpupool.services.rightsizing), as `describe` words it.
export function adviceLine(d) {
  if (!d.rightsizing) return null;
  const p = el(`<p class="advice" id="advice"><strong>Right-size:</strong> </p>`);
  p.append(flagged(d.rightsizing.message));
  return p;
}
