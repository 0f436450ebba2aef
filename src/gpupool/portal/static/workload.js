// One workload's page (#/workloads/<project>/<name>): what it asked for and where it stands, its events and
// allocations, GPU use and memory charted from its usage minutes plus the live samples, its logs (followed while
// it runs), its files, and the actions on it.
import { lineChart } from "./charts.js";
import { QUEUED, TERMINAL, adviceLine, api, call, el, esc, fmt, q, reasonOf, show, state, viaPortal } from "./core.js";

const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "–");
const mib = (m) => (m >= 1024 ? `${fmt(m / 1024, 1)} GiB` : `${m} MiB`);
const size = (b) => (b >= 1048576 ? mib(Math.round(b / 1048576)) : b >= 1024 ? `${fmt(b / 1024, 1)} KiB` : `${b} B`);

export async function workloadPage(mine, project, name) {
  const base = `/api/v1/workloads/${q(name)}`, pq = `project=${q(project)}`;
  const now = Date.now() / 1000;
  const [d, m] = await Promise.all([api(`${base}?${pq}`), api(`${base}/metrics?${pq}&start=${now - 3600}&end=${now}`)]);
  const page = el(`<div id="workload-page" data-name="${esc(d.name)}" data-project="${esc(d.project)}">
    <section><h2><a href="#/workloads">My workloads</a> / ${esc(d.project)} / ${esc(d.name)} <span class="state" id="wl-state"></span></h2>
      <p class="reason" id="wl-reason"></p><div id="wl-actions" class="actions"></div><p id="wl-err" class="error"></p>
      <table class="summary" id="wl-summary"><tbody></tbody></table></section>
    <section><h2>GPU use</h2><div class="grid" id="wl-charts"></div></section>
    <section><h2>Logs <label class="inline"><input type="checkbox" id="follow" checked> follow</label>
      ${d.workers > 1 ? `<select id="rank">${[...Array(d.workers).keys()].map((r) => `<option value="${r}">rank ${r}</option>`).join("")}</select>` : ""}</h2>
      <pre class="logs" id="logs"></pre></section>
    <section><h2>Files</h2><div id="files"></div></section>
    <section><h2>Allocations</h2><table id="wl-allocations"><thead><tr><th>Member</th><th>Node</th><th>Devices</th><th>State</th></tr></thead><tbody></tbody></table></section>
    <section><h2>Events</h2><table id="wl-events"><thead><tr><th>When</th><th>State</th><th>Event</th><th>Reason</th></tr></thead><tbody></tbody></table></section>
  </div>`);
  const util = lineChart(m.points, [{ label: "GPU use", color: "#1f9d55", get: (p) => p.gpu_util_pct }], { unit: "%", id: "util-chart" });
  const memory = lineChart(m.points, [{ label: "GPU memory (MiB)", color: "#2f6fde", get: (p) => p.gpu_memory_mib }], { id: "memory-chart" });
  page.querySelector("#wl-charts").append(util, memory);
  show(mine, page);
  draw(d);
  files(d, page.querySelector("#files"), `${base}/files?${pq}`);
  const logs = followLogs(d, page, `${base}/logs?${pq}`);
  let last = d;
  const poll = async () => {
    if (!document.body.contains(page)) return;
    try { last = await api(`${base}?${pq}`); } catch (e) { return; }
    draw(last);
    if (last.gpu_util_pct !== null || last.gpu_memory_used_mib !== null) {
      const p = { at: Date.now() / 1000, gpu_util_pct: last.gpu_util_pct, gpu_memory_mib: last.gpu_memory_used_mib };
      util.push(p);
      memory.push(p);
    }
    logs.wake(last.state);
  };
  if (mine === state.view) state.timer = setInterval(poll, 2000);
}

function draw(d) {
  const s = document.getElementById("wl-state");
  if (!s) return;
  s.textContent = d.state;
  s.className = `state ${d.state}`;
  // A suspended notebook's notice says why it stopped, when, and when it will be back (or that it waits for Resume).
  const reason = document.getElementById("wl-reason");
  reason.textContent = d.suspension ? d.suspension.notice : d.reason;
  reason.dataset.resumes = d.suspension ? d.suspension.resumes : "";
  const rows = [
    ["Owner", d.owner], ["Type", d.type], ["GPUs", gpusOf(d)],
    ["CPU", d.cpu_milli ? `${d.cpu_milli / 1000} cores` : "–"], ["Memory", d.memory_mib ? mib(d.memory_mib) : "–"],
    ["Pools", d.pools.join(", ") || "any"], ["GPU models", d.gpu_models.join(", ") || "any"], ["Image", d.image || "–"],
    ["Command", (d.command || []).join(" ") || "–"], ...(d.model ? [["Model", d.model]] : []),
    ...(d.mlflow_run_url ? [["MLflow run", external(d.mlflow_run_url)]] : []), ["Attempts", d.attempts.length ? d.attempts.map((a) => `${a.number}: ${a.outcome}`).join(", ") : "none yet"],
    ["Created", when(d.created_at)], ["Started", when(d.started_at)], ["Finished", when(d.finished_at)],
    ["Exit code", d.exit_code ?? "–"], ["Earlier runs", d.history.length ? d.history.map((h) => `#${h.id} ${h.state}`).join(", ") : "–"],
  ];
  const tbody = document.querySelector("#wl-summary tbody");
  tbody.replaceChildren(...rows.map(([k, v]) => {
    const tr = el(`<tr><th></th><td></td></tr>`);
    tr.dataset.row = k;
    tr.cells[0].textContent = k;
    if (v instanceof Node) tr.cells[1].append(v); else tr.cells[1].textContent = String(v);
    return tr;
  }));
  const advice = adviceLine(d);
  document.getElementById("advice")?.remove();
  if (advice) document.getElementById("wl-summary").before(advice);
  document.querySelector("#wl-allocations tbody").replaceChildren(...(d.allocations.length ? d.allocations.map((a) => el(`<tr><td>${Number(a.member)}</td><td>${esc(a.node)}</td>
    <td>${a.devices.map((x) => `GPU ${Number(x.index)} (${x.milli < 1000 ? `${fmt(x.milli / 10, 0)}%` : "whole"}${x.memory_mib ? `, ${esc(mib(x.memory_mib))}` : ""})`).join(", ") || "none"}</td><td>${esc(a.state)}</td></tr>`))
    : [el(`<tr><td colspan="4" class="reason">None now.</td></tr>`)]));
  document.querySelector("#wl-events tbody").replaceChildren(...d.events.slice().reverse().map((e) => el(`<tr><td>${esc(when(e.at))}</td><td>${esc(e.state)}</td><td><code>${esc(e.code)}</code></td><td>${esc(e.reason)}</td></tr>`)));
  actions(d);
}

// What it holds: one worker's request as the API writes it ("1 GPU", "0.5 GPU"); a gang's per worker, then in
// all: "2 workers × 1 GPU (2 GPUs in all)". gpu_request already says "2 × 1 GPU" for a gang, so it is not reused.
function gpusOf(d) {
  if (d.workers <= 1) return d.gpu_request;
  const n = d.workers;
  const [each, all] = d.gpus ? [d.gpus, d.gpus * n] : d.gpu_milli ? [d.gpu_milli / 1000, (d.gpu_milli * n) / 1000] : [0, 0];
  const gpu = (x) => `${x} GPU${x > 0 && x <= 1 ? "" : "s"}`;
  if (each) return `${n} workers × ${gpu(each)} (${gpu(all)} in all)`;
  if (d.gpu_memory_mib) return `${n} workers × ${mib(d.gpu_memory_mib)} of GPU memory (${mib(d.gpu_memory_mib * n)} in all)`;
  return `${n} workers, no GPU`;
}

// A link out of the portal (its MLflow run), in a new tab that learns nothing of this one; only http(s) addresses
// are links, anything else is shown as text.
function external(url) {
  let u;
  try { u = new URL(url); } catch (e) { return url; }
  if (u.protocol !== "http:" && u.protocol !== "https:") return url;
  const a = el(`<a id="wl-mlflow" target="_blank" rel="noopener noreferrer"></a>`);
  a.href = u.href;
  a.textContent = url;
  return a;
}

function actions(d) {
  const box = document.getElementById("wl-actions");
  const err = document.getElementById("wl-err");
  const want = [];
  if (d.url && d.state === "running") want.push(["Open", "", () => window.open(viaPortal(d.url), "_blank", "noopener")]);
  // One the scheduler suspended comes back by itself: Resume is for those a policy holds.
  if (d.state === "suspended" && d.suspension?.resumes !== "automatically") want.push(["Resume", "", () => act(d, "resume")]);
  if (TERMINAL.includes(d.state)) want.push(["Rerun", "", () => act(d, "rerun", true)]);
  if (!TERMINAL.includes(d.state)) want.push(["Cancel", "danger", () => { if (window.confirm(`Cancel ${d.name}? Its processes are stopped.`)) act(d, "cancel"); }]);
  const key = want.map((w) => w[0]).join();
  if (box.dataset.key === key) return;  // unchanged: keep the buttons (and a click under way)
  box.dataset.key = key;
  box.replaceChildren(...want.map(([label, cls, fn]) => { const b = el(`<button class="${cls}" data-action="${label.toLowerCase()}">${label}</button>`); b.onclick = async () => { err.textContent = ""; try { await fn(); } catch (e) { err.textContent = e.message; } }; return b; }));
}

async function act(d, verb, moves) {
  const out = await api(`/api/v1/workloads/${q(d.name)}/${verb}?project=${q(d.project)}`, { method: "POST" });
  if (moves) window.dispatchEvent(new HashChangeEvent("hashchange"));  // a rerun is a new workload of the same name
  return out;
}

// Its log from an offset, polled while "follow" is on and it may still write; each rank its own offset.
function followLogs(d, page, url) {
  const pre = page.querySelector("#logs"), follow = page.querySelector("#follow"), rank = page.querySelector("#rank");
  let offset = 0, busy = false, done = false;
  const read = async () => {
    if (busy || !document.body.contains(pre)) return;
    busy = true;
    try {
      const res = await call(`${url}&rank=${rank ? rank.value : 0}&offset=${offset}`);
      if (!res.ok) { pre.textContent = await reasonOf(res); return; }
      offset = Number(res.headers.get("X-Next-Offset"));
      const text = await res.text();
      if (text) { pre.append(document.createTextNode(text)); if (follow.checked) pre.scrollTop = pre.scrollHeight; }
      done = TERMINAL.includes(res.headers.get("X-Workload-State"));
    } finally { busy = false; }
  };
  if (rank) rank.onchange = () => { offset = 0; pre.replaceChildren(); read(); };
  follow.onchange = () => { if (follow.checked) read(); };
  const tick = setInterval(() => { if (!document.body.contains(pre)) clearInterval(tick); else if (follow.checked && !done) read(); }, 1000);
  read();
  return { wake: (s) => { if (QUEUED.includes(s)) done = false; } };
}

// Its files (the server's GET .../files: list=1 gives entries; a file's bytes or a directory's tar otherwise).
async function files(d, box, url) {
  const rankQ = "&rank=0";
  const open = async (path) => {
    const res = await call(`${url}${rankQ}&path=${q(path)}&list=1`);
    if (res.status === 404 || res.status === 405) {
      const why = res.status === 404 ? await reasonOf(res) : "";
      box.replaceChildren(el(`<p class="reason" id="files-na">Files are not available${why && why !== "Not Found" ? `: ${esc(why)}` : " on this server"}.</p>`));
      return;
    }
    // Nothing to show yet (it has not started) or ever (a backend that keeps no files): a note, not an error.
    if (res.status === 409) { box.replaceChildren(el(`<p class="reason" id="files-na">${esc(await reasonOf(res))}.</p>`)); return; }
    if (!res.ok) { box.replaceChildren(el(`<p class="error">${esc(await reasonOf(res))}</p>`)); return; }
    const entries = await res.json();
    const table = el(`<table id="file-list"><thead><tr><th>Path</th><th>Size</th><th>Modified</th><th></th></tr></thead><tbody></tbody></table>`);
    const head = el(`<p class="reason">/${esc(path)}</p>`);
    if (path) { const up = el(`<button class="secondary">Up</button>`); up.onclick = () => open(path.split("/").slice(0, -1).join("/")); head.append(" ", up); }
    for (const e of entries) {
      const tr = el(`<tr data-path="${esc(e.path)}"><td></td><td>${e.kind === "dir" ? "–" : esc(size(e.size))}</td><td>${esc(when(e.mtime))}</td><td></td></tr>`);
      const href = `${url}${rankQ}&path=${q(e.path)}`;
      if (e.kind === "dir") {
        const b = el(`<a href="#"></a>`); b.textContent = `${e.path.split("/").pop()}/`; b.onclick = (ev) => { ev.preventDefault(); open(e.path); };
        tr.cells[0].append(b);
      } else tr.cells[0].textContent = e.path.split("/").pop();
      const dl = el(`<a class="download">Download</a>`);
      dl.href = href;
      dl.download = `${e.path.split("/").pop()}${e.kind === "dir" ? ".tar" : ""}`;
      tr.cells[3].append(dl);
      table.tBodies[0].append(tr);
    }
    if (!entries.length) table.tBodies[0].append(el(`<tr><td colspan="4" class="reason">Empty.</td></tr>`));
    box.replaceChildren(head, table);
  };
  try { await open(""); } catch (e) { box.replaceChildren(el(`<p class="error">${esc(e.message)}</p>`)); }
}
