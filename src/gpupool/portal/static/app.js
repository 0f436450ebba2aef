// gpupool's portal: a few pages over the same API the CLI uses, with the caller's own token and rights.
// Everything shown that came from a user goes through text nodes or esc(), never raw HTML.
import { barChart, budgetChart, lineChart } from "./charts.js";
import { QUEUED, TERMINAL, Stale, adviceLine, age, api, call, el, esc, flagged, fmt, main, pageOf, ref, show, state, viaPortal } from "./core.js";
import { sweepPage, sweepsPage } from "./sweeps.js";
import { workloadPage } from "./workload.js";

const TYPES = ["notebook", "training", "inference", "batch"];
const STATES = ["pending", "starting", "running", "preempted", "suspended", "succeeded", "failed", "cancelled"];

function signOut() {
  state.me = null;
  location.hash = "#/login";
}
state.signedOut = signOut;

// ---- sign in ----------------------------------------------------------------------------------------------
function loginPage() {
  main.replaceChildren(el(`<section style="max-width:420px">
    <h2>Sign in to gpupool</h2>
    <form id="pw"><label><span>Name</span><input name="name" autocomplete="username"></label>
      <label><span>Password</span><input name="password" type="password" autocomplete="current-password"></label>
      <button>Sign in</button></form>
    <p class="reason">or with a token (<code>gpupool user create</code> prints one):</p>
    <form id="tok"><label><span>Token</span><input name="token" type="password"></label><button>Use token</button></form>
    <p id="sso-box" hidden><button id="sso" type="button">Sign in with single sign-on</button></p>
    <p id="err" class="error"></p></section>`));
  const fail = (e) => { document.getElementById("err").textContent = e.message; };
  const ssoError = new URLSearchParams(location.hash.split("?")[1] || "").get("sso_error");
  if (ssoError) fail(new Error(`Single sign-on failed: ${SSO_ERRORS[ssoError] || SSO_ERRORS.other}.`));
  document.getElementById("sso").onclick = () => { location.href = "/api/v1/sso/login"; };
  fetch("/api/v1/sso/config").then((r) => r.json()).then((c) => { document.getElementById("sso-box").hidden = !c.enabled; }).catch(() => {});
  document.getElementById("pw").onsubmit = async (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    try {
      // The answer sets the session's cookies; the page keeps no token of its own.
      const res = await fetch("/api/v1/login", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ name: f.get("name"), password: f.get("password") }) });
      const j = await res.json();
      if (!res.ok) throw new Error(j.detail || "sign-in failed");
      await start();
    } catch (e) { fail(e); }
  };
  document.getElementById("tok").onsubmit = async (ev) => {
    ev.preventDefault();
    // Sent once, as a bearer token: the server answers with the session's cookies for it.
    const res = await fetch("/api/v1/session", { method: "POST", headers: { Authorization: `Bearer ${new FormData(ev.target).get("token")}` } });
    // 403: a workload's, service or narrowed token, which opens no session (the server says so).
    if (!res.ok) { fail(new Error(res.status === 403 ? (await res.json()).detail : "that token is not valid")); return; }
    try { await start(); } catch (e) { fail(e); }
  };
}

// Why a single sign-on was refused: the server sends a short code, never the provider's own words.
const SSO_ERRORS = {
  no_access: "your groups give you no access to gpupool",
  email_unverified: "your identity provider has not verified your email address",
  state: "the sign-in expired or did not start here; try again",
  provider_denied: "the identity provider did not sign you in",
  provider: "the identity provider cannot be reached now",
  grant: "the identity provider refused the sign-in; try again",
  other: "the identity provider's answer could not be verified",
};

// The last step of a single sign-on: the server kept the new session in a one-time cookie, not in a URL.
async function ssoExchange() {
  try {
    // The callback set the session's cookies; this clears its one-time hand-off cookie and says whether it held.
    const res = await fetch("/api/v1/sso/session", { method: "POST" });
    const j = await res.json();
    if (!res.ok) throw new Error(j.detail || "single sign-on failed");
    history.replaceState(null, "", "/#/workloads");
    await start();
  } catch (e) {
    history.replaceState(null, "", "/#/login");
    loginPage();
    document.getElementById("err").textContent = e.message;
  }
}

// ---- my workloads, all workloads ---------------------------------------------------------------------------
// "My workloads" are the signed-in user's own (an admin's too), where new work starts; "All workloads" are all
// those the caller may see (an admin: everyone's), with a filter by user.
async function workloadsPage(mine, scope = "mine") {
  const projects = await api("/api/v1/projects");
  const own = scope === "mine";
  show(mine, el(`<div>
    ${own ? `<section><h2>Start a workload</h2>
      <div class="templates">${TYPES.map((t) => `<button class="secondary" data-template="${t}">${{ notebook: "Jupyter notebook", training: "Training", inference: "Inference service", batch: "Batch sweep" }[t]}</button>`).join("")}</div>
      <div id="form"></div></section>` : ""}
    <section><h2>${own ? "My workloads" : "All workloads"}</h2>
      <form id="filters" class="filters"><select name="project"><option value="">all projects</option>${projects.map((p) => `<option>${esc(p.name)}</option>`).join("")}</select>
        <select name="state"><option value="">any state</option>${STATES.map((x) => `<option>${x}</option>`).join("")}</select>
        ${own ? "" : `<input name="user" placeholder="user" size="12" autocomplete="off">`}</form>
      <table id="list" data-scope="${scope}"><thead><tr><th>Name</th><th>Project</th><th>Owner</th><th>Type</th><th>State</th><th>GPUs</th><th>GPU use</th><th>ETA</th><th>Age</th><th></th></tr></thead><tbody></tbody></table>
      <div id="detail"></div></section></div>`));
  main.querySelectorAll("[data-template]").forEach((b) => { b.onclick = () => showForm(b.dataset.template, projects); });
  const filters = document.getElementById("filters");
  filters.onchange = refreshList;
  if (filters.user) filters.user.oninput = refreshList;
  filters.onsubmit = (ev) => { ev.preventDefault(); refreshList(); };
  await refreshList();
  if (mine === state.view) state.timer = setInterval(refreshList, 2000);
}

async function showForm(type, projects) {
  const box = document.getElementById("form");
  const defaults = { notebook: ["fraction", 0.25], training: ["whole", 1], inference: ["fraction", 0.5], batch: ["fraction", 0.5] }[type];
  box.replaceChildren(el(`<form id="submit">
    <h3>New ${esc(type)}</h3>
    <label><span>Project</span><select name="project">${projects.map((p) => `<option>${esc(p.name)}</option>`).join("")}</select></label>
    <div id="headroom" class="headroom"></div>
    <label><span>Name</span><input name="name" placeholder="generated if empty"></label>
    <label><span>GPU</span><select name="kind"><option value="fraction">a fraction of one GPU</option><option value="whole">whole GPUs</option><option value="memory">GPU memory (GiB)</option><option value="none">no GPU</option></select>
      <input name="amount" type="number" step="any" min="0" style="width:6rem"></label>
    ${type === "training" || type === "batch" ? `<label><span>Workers</span><input name="workers" type="number" min="1" value="1" style="width:6rem"></label>` : ""}
    ${type === "notebook" ? "" : `<label><span>Command</span><input name="command" size="60" placeholder="${type === "batch" ? "python train.py --lr {value}" : "python train.py --epochs 10"}"></label>`}
    ${type === "batch" ? `<label><span>Values</span><input name="values" size="40" placeholder="0.1, 0.01, 0.001"></label>
      <p class="reason">One trial per value, named &lt;name&gt;-0, -1, …: <code>{value}</code> in the command is replaced by the trial's value (quoted for the shell); SWEEP_INDEX and SWEEP_VALUE are in its environment.</p>` : ""}
    <button>Submit</button> <span id="submit-err" class="error"></span></form>`));
  const form = document.getElementById("submit");
  form.kind.value = defaults[0];
  form.amount.value = defaults[1];
  const headroom = async () => {
    const shares = await api("/api/v1/shares");
    const s = shares.find((x) => x.queue === form.project.value);
    document.getElementById("headroom").textContent = s
      ? `Quota of ${s.queue}: ${fmt(s.deserved, 2)} GPUs deserved, ${fmt(s.allocated, 2)} in use, fair share now ${fmt(s.fair_share, 2)}` +
        `${s.limit === null ? "" : `, limit ${fmt(s.limit, 2)}`}. Headroom within deserved: ${fmt(Math.max(0, s.deserved - s.allocated), 2)} GPUs` +
        `${s.limit === null ? "; beyond that it can borrow idle GPUs (preemptible work only)." : `; up to ${fmt(Math.max(0, s.limit - s.allocated), 2)} with borrowing.`}`
      : "No quota information yet for this project.";
    const pol = await api(`/api/v1/queues/${encodeURIComponent(form.project.value)}/policy`);
    const idle = pol.idle_timeout_s[type], run = pol.max_runtime_s[type];
    const notes = [];
    if (idle) notes.push(`${type === "notebook" ? "suspended" : "stopped"} after ${Math.round(idle / 60)} min below ${pol.idle_threshold_pct}% GPU use`);
    if (run) notes.push(`stopped after ${Math.round(run / 60)} min of running`);
    if (notes.length) document.getElementById("headroom").append(document.createTextNode(` Policy for a ${type} here: ${notes.join("; ")}.`));
  };
  form.project.onchange = headroom;
  await headroom();
  form.onsubmit = async (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    const body = { project: f.get("project"), type };
    if (f.get("name")) body.name = f.get("name");
    const amount = Number(f.get("amount"));
    if (f.get("kind") === "fraction") body.gpu = amount;
    if (f.get("kind") === "whole") body.gpus = Math.round(amount);
    if (f.get("kind") === "memory") body.gpu_memory = `${amount}GiB`;
    if (f.get("workers")) body.workers = Number(f.get("workers"));
    if (f.get("command")) body.command = ["sh", "-c", f.get("command")];
    try {
      if (type === "batch" && String(f.get("values") || "").trim()) await sweep(body, String(f.get("values")));
      else await api("/api/v1/workloads", { method: "POST", body });
      box.replaceChildren();
      await refreshList();
    } catch (e) { document.getElementById("submit-err").textContent = e.message; }
  };
}

// A batch sweep: one workload per value, <base>-0..N-1, each with the value put into its command. The values are
// the user's own, but quoted for the shell all the same, so a value is one argument and never more commands.
const shellQuote = (v) => `'${v.replace(/'/g, "'\\''")}'`;
export function sweepBodies(body, valuesText) {
  const values = valuesText.split(",").map((v) => v.trim()).filter((v) => v !== "");
  const base = body.name || `sweep-${Date.now().toString(36)}`;
  const command = body.command ? body.command[2] : "";
  if (!command.includes("{value}")) throw new Error("the command needs {value} where each trial's value goes");
  return values.map((v, i) => ({
    ...body, name: `${base}-${i}`, command: ["sh", "-c", command.replaceAll("{value}", shellQuote(v))],
    env: { ...(body.env || {}), SWEEP_INDEX: String(i), SWEEP_VALUE: v },
  }));
}

async function sweep(body, valuesText) {
  const bodies = sweepBodies(body, valuesText);
  if (!bodies.length) throw new Error("give at least one value, separated by commas");
  for (const [i, b] of bodies.entries()) {
    try { await api("/api/v1/workloads", { method: "POST", body: b }); } catch (e) {
      throw new Error(`trial ${b.name} (${i + 1} of ${bodies.length}): ${e.message}${i ? `; ${i} submitted before it` : ""}`);
    }
  }
}

async function refreshList() {
  const tbody = document.querySelector("#list tbody");
  if (!tbody) return;
  const f = new FormData(document.getElementById("filters"));
  const params = new URLSearchParams({ limit: "200" });
  for (const k of ["project", "state", "user"]) if (f.get(k)) params.set(k, String(f.get(k)).trim());
  if (tbody.closest("table").dataset.scope === "mine") params.set("user", state.me.name);  // the submitter's own
  const page = await api(`/api/v1/workloads?${params}`);
  if (document.querySelector("#list tbody") !== tbody) return;
  tbody.replaceChildren(...page.items.map((w) => {
    const tr = el(`<tr data-name="${esc(w.name)}"><td><a class="wl-link"></a></td><td>${esc(w.project)}</td><td class="owner">${esc(w.owner)}</td><td>${esc(w.type)}</td>
      <td><span class="state ${esc(w.state)}">${esc(w.state)}</span><div class="reason" title="${esc(w.reason)}">${esc(QUEUED.includes(w.state) ? w.reason_short || w.reason : w.reason)}</div></td>
      <td>${esc(w.gpu_request)}${w.node ? `<div class="reason">${esc(w.node)}: ${w.devices.join(",")}</div>` : ""}</td>
      <td>${w.gpu_util_pct === null ? "–" : `<span class="bar"><i style="width:${Number(w.gpu_util_pct)}%"></i></span> ${Number(w.gpu_util_pct)}%`}</td>
      <td class="eta">${eta(w)}</td><td>${age(w.created_at)}</td><td class="actions"></td></tr>`);
    const link = tr.querySelector(".wl-link");
    link.href = pageOf(w);
    link.textContent = w.name;
    const actions = tr.querySelector(".actions");
    const add = (label, cls, fn) => { const b = el(`<button class="${cls}">${label}</button>`); b.onclick = fn; actions.append(b, " "); };
    if ((w.type === "notebook" || w.type === "inference") && w.state === "running") add("Open", "", () => openWorkload(w));
    if (QUEUED.includes(w.state)) add("Why", "secondary", () => showWhy(w));
    add("Logs", "secondary", () => showLogs(w));
    if (w.state === "suspended") add("Resume", "", () => act(w, "resume"));
    if (!TERMINAL.includes(w.state)) add("Cancel", "danger", () => { if (window.confirm(`Cancel ${w.name}? Its processes are stopped.`)) act(w, "cancel"); });
    return tr;
  }));
}

// What an estimate rests on, in words: the API's eta_basis is a code ("history"), which printed as it is beside
// "now" read as "now history".
const BASIS = { declared: "from declared max durations", history: "from the project's past runtimes", none: "nothing running is expected to end" };

// A queued workload's estimated start, relative, with what it rests on; "–" for any other. An estimate due
// within the minute (or just past: the scheduler rewrites it within a minute or two) is "within a minute".
function eta(w) {
  if (!QUEUED.includes(w.state) || !w.eta_basis) return "–";
  const basis = `<div class="reason">${esc(BASIS[w.eta_basis] || "")}</div>`;
  if (w.eta === null) return `<span>unknown</span> ${basis}`;
  const at = new Date(w.eta);
  const s = Math.round((at.getTime() - Date.now()) / 1000);
  const rel = s < 60 ? "within a minute" : s >= 86400 ? `in ${Math.floor(s / 86400)}d${Math.floor((s % 86400) / 3600)}h`
    : s >= 3600 ? `in ${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m` : `in ${Math.floor(s / 60)}m`;
  // The space keeps the two apart in the cell's text too (what a screen reader or a copy reads).
  return `<span title="${esc(at.toLocaleString())}">${rel}</span> ${basis}`;
}

// Why a queued workload waits: the server's sentence (rendered from the scheduler's code and numbers), the numbers
// themselves, and where it stands in its project's queue.
async function showWhy(w) {
  const d = await api(ref(w));
  const box = document.getElementById("detail");
  const numbers = Object.entries(d.reason_args || {}).map(([k, v]) => `${esc(k)}=${esc(String(v))}`).join(" ");
  const p = d.position;
  const where = p ? `${p.project} of ${p.project_queued} in project ${esc(d.project)}'s queue` : "";
  box.replaceChildren(el(`<section id="why"><h3>Why ${esc(d.name)} waits</h3>
    <p class="why-reason">${esc(d.reason)}${d.reason_code ? ` <code>${esc(d.reason_code)}</code>` : ""}</p>
    ${numbers ? `<p class="reason why-numbers">${numbers}</p>` : ""}
    ${where ? `<p class="why-position">Position: ${where} (by priority, then submit time)</p>` : ""}</section>`));
  const advice = adviceLine(d);
  if (advice) box.querySelector("#why").append(advice);
}

async function act(w, verb) {
  await api(`/api/v1/workloads/${encodeURIComponent(w.name)}/${verb}?project=${encodeURIComponent(w.project)}`, { method: "POST" });
  await refreshList();
}

async function openWorkload(w) {
  const d = await api(ref(w));
  const box = document.getElementById("detail");
  if (!d.url) { box.replaceChildren(el(`<p class="error">It has no URL yet: ${esc(d.reason)}</p>`)); return; }
  const a = el(`<p>${esc(d.name)}: <a id="open-link" target="_blank" rel="noopener"></a></p>`);
  a.querySelector("a").href = viaPortal(d.url);
  a.querySelector("a").textContent = d.url.split("?")[0];
  box.replaceChildren(a);
  window.open(viaPortal(d.url), "_blank", "noopener");
}

async function showLogs(w) {
  const box = document.getElementById("detail");
  const pre = el(`<pre class="logs" id="logs"></pre>`);
  const head = el(`<h3>Logs of ${esc(w.name)}</h3>`);
  box.replaceChildren(head, pre);
  // Its advice above its logs, once known; the logs do not wait for it, nor fail without it.
  api(ref(w)).then((d) => { const advice = adviceLine(d); if (advice && document.body.contains(pre)) head.after(advice); })
    .catch(() => { /* the logs stand alone */ });
  let offset = 0;
  const poll = async () => {
    if (!document.body.contains(pre)) return;
    const res = await call(`/api/v1/workloads/${encodeURIComponent(w.name)}/logs?project=${encodeURIComponent(w.project)}&offset=${offset}`);
    if (!res.ok) return;
    offset = Number(res.headers.get("X-Next-Offset"));
    pre.append(document.createTextNode(await res.text()));
    if (!["succeeded", "failed", "cancelled"].includes(res.headers.get("X-Workload-State"))) setTimeout(poll, 1000);
  };
  await poll();
}

// ---- cluster ---------------------------------------------------------------------------------------------
async function clusterPage(mine) {
  const [nodes, timeline] = await Promise.all([api("/api/v1/nodes"), api("/api/v1/reports/timeline")]);
  const map = el(`<section><h2>GPU map</h2><div id="gpu-map"></div></section>`);
  // Grouped by cluster, by name, each group a grid of its nodes (one cluster: no heading).
  const clusters = [...new Set(nodes.map((n) => n.cluster))].sort();
  const grids = new Map(clusters.map((c) => {
    const gpus = nodes.filter((n) => n.cluster === c).reduce((sum, n) => sum + n.devices.length, 0);
    const group = el(`<div class="cluster" data-cluster="${esc(c)}">${clusters.length > 1 ? `<h3>Cluster ${esc(c)} <span class="reason">${gpus} GPU${gpus === 1 ? "" : "s"}</span></h3>` : ""}<div class="grid"></div></div>`);
    map.querySelector("#gpu-map").append(group);
    return [c, group.querySelector(".grid")];
  }));
  for (const n of nodes) {
    const w = 120, devs = n.devices;
    const svg = devs.map((d, i) => {
      const fill = Math.min(1, d.allocated_milli / 1000);
      return `<g transform="translate(${i * (w + 8)},0)" data-device="${d.index}"><rect width="${w}" height="90" rx="6" fill="#f3f4f6" stroke="#d1d5db"/>
        <rect y="${90 - 90 * fill}" width="${w}" height="${90 * fill}" rx="6" fill="#2f6fde" opacity=".25"/>
        <text x="8" y="16">GPU ${d.index} · ${esc(d.model)}</text><text x="8" y="32">${fmt(fill * 100, 0)}% allocated</text>
        ${d.workloads.slice(0, 3).map((name, k) => `<text x="8" y="${50 + k * 14}">${esc(name)}</text>`).join("")}
        ${d.workloads.length > 3 ? `<text x="8" y="92">+${d.workloads.length - 3} more</text>` : ""}</g>`;
    }).join("");
    grids.get(n.cluster).append(el(`<div><h3>${esc(n.name)} <span class="reason">pool ${esc(n.pool)}</span></h3>
      <svg width="${devs.length * (w + 8)}" height="96" role="img" aria-label="GPUs of ${esc(n.name)}">${svg}</svg></div>`));
  }
  const over = el(`<section><h2>Utilisation over the last hour (GPUs)</h2></section>`);
  over.append(lineChart(timeline, [
    { label: "allocated", color: "#2f6fde", get: (p) => p.allocated_gpus },
    { label: "busy", color: "#1f9d55", get: (p) => p.busy_gpus },
  ]));
  show(mine, map, over);
}

// ---- quotas ----------------------------------------------------------------------------------------------
async function quotasPage(mine) {
  const shares = await api("/api/v1/shares");
  const admin = state.me.role === "admin";
  const sec = el(`<section><h2>Quotas</h2><table id="quotas"><thead><tr><th>Department / project</th><th>Pool</th><th>Deserved</th><th>Fair share</th><th>In use</th><th>Limit</th><th>Pending demand</th>${admin ? "<th></th>" : ""}</tr></thead><tbody></tbody></table><p id="quota-err" class="error"></p></section>`);
  const tbody = sec.querySelector("tbody");
  for (const s of shares) {
    const tr = el(`<tr data-queue="${esc(s.queue)}"><td>${s.kind === "project" ? "&nbsp;&nbsp;" : "<strong>"}${esc(s.queue)}${s.kind === "project" ? "" : "</strong>"}</td><td>${esc(s.pool)}</td>
      <td>${admin ? `<input name="deserved" type="number" step="any" min="0" style="width:5rem" value="${s.deserved}">` : fmt(s.deserved)}</td>
      <td>${fmt(s.fair_share)}</td><td>${fmt(s.allocated)}</td>
      <td>${admin ? `<input name="limit" type="number" step="any" min="0" style="width:5rem" value="${s.limit ?? ""}" placeholder="none">` : s.limit === null ? "–" : fmt(s.limit)}</td>
      <td>${fmt(Math.max(0, s.demand - s.allocated))} GPUs${s.pending ? ` (${s.pending} waiting)` : ""}</td>${admin ? "<td><button>Save</button></td>" : ""}</tr>`);
    if (admin) {
      tr.querySelector("button").onclick = async () => {
        const body = { pool: s.pool, deserved_gpus: Number(tr.querySelector("[name=deserved]").value) };
        const limit = tr.querySelector("[name=limit]").value;
        if (limit === "") body.clear_limit = true; else body.limit_gpus = Number(limit);
        try { await api(`/api/v1/queues/${encodeURIComponent(s.queue)}/quota`, { method: "PATCH", body }); sec.querySelector("#quota-err").textContent = ""; tr.classList.add("saved"); }
        catch (e) { sec.querySelector("#quota-err").textContent = e.message; }
      };
    }
    tbody.append(tr);
  }
  const chart = el(`<section><h2>Deserved and in use, by project</h2></section>`);
  chart.append(barChart(shares.filter((s) => s.kind === "project"), [
    { label: "in use", color: "#2f6fde", get: (r) => r.allocated },
    { label: "deserved, unused", color: "#c7d7f5", get: (r) => Math.max(0, r.deserved - r.allocated) },
  ]));
  show(mine, sec, chart);
}

// ---- waste -----------------------------------------------------------------------------------------------
async function wastePage(mine) {
  const end = Date.now() / 1000;
  const [running, suspended, timeline, day, sizing] = await Promise.all([
    api("/api/v1/workloads?state=running&limit=1000"), api("/api/v1/workloads?state=suspended&limit=1000"), api("/api/v1/reports/timeline"),
    api(`/api/v1/reports/usage?start=${end - 86400}&end=${end}&by=project`), api(`/api/v1/reports/rightsizing?start=${end - 7 * 86400}&end=${end}`),
  ]);
  const idle = running.items.filter((w) => w.gpu_util_pct !== null && w.gpu_util_pct < 5 && (w.gpus || w.gpu_milli || w.gpu_memory_mib));
  const now = el(`<section><h2>Allocated but idle now</h2><table id="idle-now"><thead><tr><th>Workload</th><th>Project</th><th>GPUs</th><th>GPU use</th></tr></thead><tbody>
    ${idle.map((w) => `<tr><td>${esc(w.name)}</td><td>${esc(w.project)}</td><td>${esc(w.gpu_request)}</td><td>${Number(w.gpu_util_pct)}%</td></tr>`).join("") || `<tr><td colspan="4" class="reason">Nothing idle right now.</td></tr>`}</tbody></table></section>`);
  const flagged = suspended.items.filter((w) => w.reason_code === "idle" || w.reason_code === "max-runtime");
  const pol = el(`<section><h2>Stopped by idle policies</h2><table id="flagged"><tbody>
    ${flagged.map((w) => `<tr><td>${esc(w.name)}</td><td>${esc(w.project)}</td><td class="reason">${esc(w.reason)}</td></tr>`).join("") || `<tr><td class="reason">None.</td></tr>`}</tbody></table></section>`);
  const over = el(`<section><h2>Idle-allocated GPUs over the last hour</h2></section>`);
  over.append(lineChart(timeline, [{ label: "allocated but idle", color: "#e0a100", get: (p) => Math.max(0, p.allocated_gpus - p.busy_gpus) }]));
  const byProject = el(`<section><h2>Idle-allocated GPU-hours by project, last 24 hours</h2></section>`);
  byProject.append(day.lines.length ? barChart(day.lines, [{ label: "idle-allocated GPU-hours", color: "#e0a100", get: (l) => l.idle_gpu_hours }]) : el(`<p class="reason">No usage yet.</p>`));
  show(mine, now, pol, over, byProject, rightsizingSection(sizing));
}

// GiB rounded up to a tenth, as the advice writes "used at most".
const atMostGib = (mib) => `${Math.ceil((mib * 10) / 1024) / 10} GiB`;

function rightsizingSection(r) {
  const sec = el(`<section><h2>Right-sizing, last 7 days</h2>
    <p class="reason">Work whose peak GPU memory or use stayed far under what it holds, after 30 minutes of samples, and the request that would do.</p>
    <table id="rightsizing"><thead><tr><th>Workload</th><th>Project</th><th>Request</th><th>Peak memory, use</th><th>Busy</th><th>GPU-hours</th><th>Would free</th><th>Advice</th></tr></thead><tbody></tbody></table>
    <h3>GPU-hours right-sizing would have freed</h3>
    <table id="rightsizing-projects"><thead><tr><th>Project</th><th>GPU-hours</th><th>Would have freed</th><th>Workloads advised</th></tr></thead><tbody>
    ${r.projects.length ? [...r.projects, r.total].map((t) => `<tr data-project="${esc(t.project)}"><td>${esc(t.project)}</td><td>${fmt(t.gpu_hours)}</td><td>${fmt(t.freed_gpu_hours)}</td><td>${Number(t.advised)}</td></tr>`).join("")
      : `<tr><td colspan="4" class="reason">No GPUs held in this period.</td></tr>`}</tbody></table></section>`);
  const tbody = sec.querySelector("#rightsizing tbody");
  for (const x of r.lines) {
    const peak = x.peak_gpu_memory_mib === null ? "–" : `${atMostGib(x.peak_gpu_memory_mib)}, ${x.peak_gpu_util_pct === null ? "–" : `${Number(x.peak_gpu_util_pct)}%`}`;
    const tr = el(`<tr data-workload="${esc(x.project)}/${esc(x.workload)}"><td>${esc(x.workload)}</td><td>${esc(x.project)}</td><td>${esc(x.request)}</td>
      <td>${esc(peak)}</td><td>${x.busy_pct === null ? "–" : `${Number(x.busy_pct)}%`}</td><td>${fmt(x.gpu_hours)}</td><td>${fmt(x.freed_gpu_hours)}</td><td class="advice"></td></tr>`);
    tr.querySelector(".advice").append(x.advice ? flagged(x.advice.message) : "–");
    tbody.append(tr);
  }
  if (!r.lines.length) tbody.append(el(`<tr><td colspan="8" class="reason">No workload held GPUs in this period.</td></tr>`));
  return sec;
}

// ---- costs -----------------------------------------------------------------------------------------------
async function costsPage(mine) {
  const sec = el(`<section><h2>Costs</h2>
    <label><span>Period</span><select name="period"><option value="86400">last 24 hours</option><option value="604800">last 7 days</option><option value="2592000">last 30 days</option></select></label>
    <label><span>By</span><select name="by"><option>department</option><option selected>project</option><option>user</option></select></label>
    <div id="report"></div></section>`);
  show(mine, sec);
  const draw = async () => {
    const end = Date.now() / 1000, start = end - Number(sec.querySelector("[name=period]").value);
    const by = sec.querySelector("[name=by]").value;
    const r = await api(`/api/v1/reports/usage?start=${start}&end=${end}&by=${by}`);
    const box = sec.querySelector("#report");
    const table = el(`<table id="costs"><thead><tr><th>${esc(by)}</th><th>GPU-hours</th><th>busy</th><th>idle</th><th>cost</th><th>on-premises</th><th>burst</th><th>busy cost</th><th>idle cost</th></tr></thead><tbody>
      ${[...r.lines, r.total].map((l) => `<tr data-key="${esc(l.key)}"><td>${esc(l.key)}</td><td>${fmt(l.gpu_hours, 3)}</td><td>${fmt(l.busy_gpu_hours, 3)}</td><td>${fmt(l.idle_gpu_hours, 3)}</td><td>${fmt(l.cost)}</td><td>${fmt(l.on_prem_cost)}</td><td>${fmt(l.burst_cost)}</td><td>${fmt(l.busy_cost)}</td><td>${fmt(l.idle_cost)}</td></tr>`).join("")}</tbody></table>`);
    box.replaceChildren(table, barChart(r.lines, [
      { label: "on-premises cost", color: "#1f9d55", get: (l) => l.on_prem_cost },
      { label: "burst cost", color: "#2b6cb0", get: (l) => l.burst_cost },
    ]), barChart(r.lines, [
      { label: "busy GPU-hours", color: "#1f9d55", get: (l) => l.busy_gpu_hours },
      { label: "idle-allocated GPU-hours", color: "#e0a100", get: (l) => l.idle_gpu_hours },
    ]), budgetsSection(r.budgets || []));
  };
  sec.querySelectorAll("select").forEach((s) => { s.onchange = draw; });
  await draw();
}

const dollars = (x) => (x === null || x === undefined ? "–" : `$${fmt(x)}`);

// Each department's burst spending this month against its budget, and what it rented in the period unused.
function budgetsSection(budgets) {
  const sec = el(`<div id="budgets"><h3>Burst budgets</h3>
    <p class="reason">Rented nodes are billed from the ask to their release, busy or idle. Spent and forecast: this calendar month (UTC) to now, the forecast at this month's pace; rented and unused: the period above.</p>
    <table><thead><tr><th>Department</th><th>Budget a month</th><th>Spent</th><th>Forecast</th><th>Per hour now</th><th>Rented</th><th>Unused</th><th>Refused</th></tr></thead><tbody>
    ${budgets.map((b) => `<tr data-department="${esc(b.department)}"><td>${esc(b.department)}</td><td>${dollars(b.monthly_budget)}</td><td>${dollars(b.spent)}</td><td>${dollars(b.forecast)}</td><td>${dollars(b.rate_per_hour)}</td><td>${dollars(b.rented_cost)}</td><td>${dollars(b.unused_cost)}</td><td>${esc(b.refused ?? "–")}</td></tr>`).join("")
      || `<tr><td colspan="8" class="reason">No department you see has a burst budget or rented nodes in this period.</td></tr>`}</tbody></table></div>`);
  if (budgets.length) sec.append(budgetChart(budgets));
  return sec;
}

// ---- routing ---------------------------------------------------------------------------------------------
const PAGES = { workloads: workloadsPage, all: (m) => workloadsPage(m, "all"), sweeps: sweepsPage, cluster: clusterPage, quotas: quotasPage, waste: wastePage, costs: costsPage };
// One workload's or one sweep's own page: #/<page>/<project>/<name>.
const DETAIL = { workloads: workloadPage, sweeps: sweepPage };

async function route() {
  clearInterval(state.timer);
  const mine = ++state.view;
  const [page, ...rest] = (location.hash.replace("#/", "").split("?")[0] || "workloads").split("/");
  if (page === "sso") { await ssoExchange(); return; }
  if (page === "login") { loginPage(); return; }
  // Signed in or not is the session cookie's to say (HttpOnly: only the server reads it), so a new tab asks.
  if (!state.me) { try { await start(); } catch (e) { if (mine === state.view) loginPage(); } return; }
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.page === page));
  const detail = Object.hasOwn(DETAIL, page) && rest.length === 2 ? DETAIL[page] : null;
  const draw = detail ? (m) => detail(m, decodeURIComponent(rest[0]), decodeURIComponent(rest[1])) : (Object.hasOwn(PAGES, page) && PAGES[page]) || workloadsPage;
  try { await draw(mine); } catch (e) {
    if (!(e instanceof Stale) && e.message !== "signed out" && mine === state.view) main.replaceChildren(el(`<p class="error">${esc(e.message)}</p>`));
  }
}

async function start() {
  const me = await api("/api/v1/whoami");
  state.me = me;
  const who = document.getElementById("who");
  who.textContent = who.title = `${me.name} (${me.role})`;  // the title whole where a narrow window cuts the name
  document.getElementById("nav").hidden = false;
  document.getElementById("signout").hidden = false;
  if (!location.hash || location.hash.startsWith("#/login") || location.hash.startsWith("#/sso")) location.hash = "#/workloads"; else await route();
}

document.getElementById("signout").onclick = async () => {
  // A session from the sign-in form ends on the server too; either way the server clears the session's cookies.
  try { await api("/api/v1/logout", { method: "POST" }); } catch (e) { /* gone already */ }
  document.getElementById("nav").hidden = true;
  document.getElementById("signout").hidden = true;
  document.getElementById("who").textContent = "";
  signOut();
};
window.addEventListener("hashchange", route);
route();
