// Hyperparameter sweeps (#/sweeps, #/sweeps/<project>/<name>): Optuna studies whose trials run as workloads
// (gpupool.services.sweeps). The sweeps of the caller's projects; one sweep's best trial, its trials (each linking
// to its workload's page), Optuna's optimisation history as the server draws it, and its cancel.
// Everything shown that came from a user goes through text nodes or esc(), never raw HTML.
import { api, call, el, esc, pageOf, q, reasonOf, show, state } from "./core.js";

const FINISHED = ["complete", "pruned", "fail"];
const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "–");
// A value as the CLI prints it: six significant digits.
const num = (v) => (v === null || v === undefined ? "–" : String(Number(Number(v).toPrecision(6))));
const params = (p) => Object.keys(p || {}).sort().map((k) => `${k}=${typeof p[k] === "number" ? num(p[k]) : p[k]}`).join(" ") || "–";
const done = (s) => FINISHED.reduce((n, k) => n + (s.counts[k] || 0), 0);
const counts = (s) => Object.entries(s.counts).map(([k, n]) => `${n} ${k}`).join(", ");
const sweepOf = (s) => `#/sweeps/${q(s.project)}/${q(s.name)}`;

// ---- the list ----------------------------------------------------------------------------------------------
export async function sweepsPage(mine) {
  const rows = await api("/api/v1/sweeps");
  const sec = el(`<section><h2>Sweeps</h2>
    <p class="reason">Optuna studies whose trials run as workloads of their project: <code>gpupool sweep -f sweep.yaml</code> starts one.</p>
    <table id="sweeps"><thead><tr><th>Sweep</th><th>Project</th><th>State</th><th>Trials done</th><th>Best value</th><th>Objective</th></tr></thead><tbody></tbody></table></section>`);
  const tbody = sec.querySelector("tbody");
  show(mine, sec);
  fillList(tbody, rows);
  const refresh = async () => {
    let next;
    try { next = await api("/api/v1/sweeps"); } catch (e) { return; }
    if (document.body.contains(tbody)) fillList(tbody, next);
  };
  if (mine === state.view) state.timer = setInterval(refresh, 2000);
}

function fillList(tbody, rows) {
  tbody.replaceChildren(...rows.map((s) => {
    const tr = el(`<tr data-sweep="${esc(s.project)}/${esc(s.name)}"><td><a class="sw-link"></a></td><td>${esc(s.project)}</td>
      <td><span class="state ${esc(s.state)}">${esc(s.state)}</span></td>
      <td class="done"><span class="count">${done(s)} / ${Number(s.trials)}</span><div class="reason">${esc(counts(s))}</div></td>
      <td class="best">${s.best ? `<span class="value">${esc(num(s.best.value))}</span> <span class="reason">trial ${Number(s.best.number)}</span>` : "–"}</td>
      <td class="objective">${esc(s.direction)} ${esc(s.metric)}</td></tr>`);
    const link = tr.querySelector(".sw-link");
    link.href = sweepOf(s);
    link.textContent = s.name;
    return tr;
  }));
  if (!rows.length) tbody.append(el(`<tr><td colspan="6" class="reason">No sweeps in your projects yet.</td></tr>`));
}

// ---- one sweep -----------------------------------------------------------------------------------------------
export async function sweepPage(mine, project, name) {
  const base = `/api/v1/sweeps/${q(project)}/${q(name)}`;
  const d = await api(base);
  const page = el(`<div id="sweep-page" data-name="${esc(d.name)}" data-project="${esc(d.project)}">
    <section><h2><a href="#/sweeps">Sweeps</a> / ${esc(d.project)} / ${esc(d.name)} <span class="state" id="sw-state"></span></h2>
      <div id="sw-actions" class="actions"></div><p id="sw-err" class="error"></p>
      <table class="summary" id="sw-summary"><tbody></tbody></table></section>
    <section><h2>Best trial</h2><div id="sw-best"></div></section>
    <section><h2>Optimisation history</h2><div id="sw-plot"></div></section>
    <section><h2>Trials</h2><table id="sw-trials"><thead><tr><th>Trial</th><th>State</th><th>Value</th><th>Step</th><th>Parameters</th><th>Workload</th></tr></thead><tbody></tbody></table></section>
  </div>`);
  show(mine, page);
  let plotted = null, plots = 0, trials = null;
  const draw = (d) => {
    summary(d);
    best(d);
    actions(d, base, poll);
    const key = JSON.stringify(d.trial_list);
    if (key !== trials) { trials = key; trialRows(d); }  // unchanged: keep the rows (and a click under way)
    // Optuna's plot shows completed trials: drawn again when one more has completed.
    const complete = d.counts.complete || 0;
    if (complete !== plotted) { plotted = complete; plot(page.querySelector("#sw-plot"), `${base}/plot.png`, ++plots, () => plots); }
  };
  const poll = async () => {
    if (!document.body.contains(page)) return;
    let next;
    try { next = await api(base); } catch (e) { return; }
    if (document.body.contains(page)) draw(next);
  };
  draw(d);
  if (mine === state.view) state.timer = setInterval(poll, 2000);
}

function summary(d) {
  const s = document.getElementById("sw-state");
  s.textContent = d.state;
  s.className = `state ${d.state}`;
  const spec = d.spec;
  const gpu = spec.gpu ? `${spec.gpu} GPU` : spec.gpus ? `${spec.gpus} GPU${spec.gpus > 1 ? "s" : ""}` : "no GPU";
  const rows = [
    ["Objective", `${d.direction} ${d.metric}`],
    ["Trials", `${done(d)} of ${d.trials} done${Object.keys(d.counts).length ? ` (${counts(d)})` : ""}, ${d.parallelism} at a time`],
    ["Sampler", `${spec.sampler.kind}${spec.sampler.seed === null ? "" : `, seed ${spec.sampler.seed}`}; pruner: ${spec.pruner.kind}`],
    ["Each trial", `${gpu}, priority ${spec.priority}`], ["Command", spec.command.join(" ")], ["Created", when(d.created_at)],
  ];
  document.querySelector("#sw-summary tbody").replaceChildren(...rows.map(([k, v]) => {
    const tr = el(`<tr><th></th><td></td></tr>`);
    tr.dataset.row = k;
    tr.cells[0].textContent = k;
    tr.cells[1].textContent = v;
    return tr;
  }));
}

function best(d) {
  const box = document.getElementById("sw-best");
  if (!d.best) { box.replaceChildren(el(`<p class="reason">No trial has completed yet.</p>`)); return; }
  const t = d.best;
  box.replaceChildren(el(`<table class="summary"><tbody>
    <tr><th>Trial</th><td id="sw-best-number">${Number(t.number)}</td></tr>
    <tr><th>${esc(d.metric)}</th><td id="sw-best-value">${esc(num(t.value))}</td></tr>
    <tr><th>Parameters</th><td id="sw-best-params">${esc(params(t.params))}</td></tr></tbody></table>`));
}

function trialRows(d) {
  const tbody = document.querySelector("#sw-trials tbody");
  tbody.replaceChildren(...d.trial_list.map((t) => {
    const tr = el(`<tr data-trial="${Number(t.number)}"><td>${Number(t.number)}</td><td><span class="state ${esc(t.state)}" title="${esc(t.reason || "")}">${esc(t.state)}</span></td>
      <td class="value">${esc(num(t.value))}</td><td>${t.last_step === null ? "–" : Number(t.last_step)}</td>
      <td class="params">${esc(params(t.params))}</td><td class="workload">–</td></tr>`);
    if (t.workload) {
      // The trial's workload runs in the sweep's project; written `project/name` or by its name alone.
      const [wp, wn] = t.workload.includes("/") ? t.workload.split("/", 2) : [d.project, t.workload];
      const a = el(`<a class="wl-link"></a>`);
      a.href = pageOf({ project: wp, name: wn });
      a.textContent = wn;
      tr.querySelector(".workload").replaceChildren(a);
    }
    return tr;
  }));
  if (!d.trial_list.length) tbody.append(el(`<tr><td colspan="6" class="reason">No trial asked yet.</td></tr>`));
}

function actions(d, base, after) {
  const box = document.getElementById("sw-actions");
  const key = d.state === "running" ? "cancel" : "";
  if (box.dataset.key === key) return;  // unchanged: keep the button (and a click under way)
  box.dataset.key = key;
  if (!key) { box.replaceChildren(); return; }
  const b = el(`<button class="danger" data-action="cancel">Cancel sweep</button>`);
  b.onclick = async () => {
    const err = document.getElementById("sw-err");
    err.textContent = "";
    if (!window.confirm(`Cancel the sweep ${d.name}? No new trial starts, and the running ones are stopped.`)) return;
    try { await api(`${base}/cancel`, { method: "POST" }); } catch (e) { err.textContent = e.message; return; }
    await after();
  };
  box.replaceChildren(b);
}

// The server's PNG, fetched with the session like every call, shown as a data: URL (the page's policy allows
// images from itself and data:, not blob:). `seq` and `latest` keep an older answer from replacing a newer one.
async function plot(box, url, seq, latest) {
  let node;
  try {
    const res = await call(url);
    if (!res.ok) node = el(`<p class="reason" id="sw-plot-na">No plot: ${esc(await reasonOf(res))}</p>`);
    else {
      const blob = await res.blob();
      if (blob.type !== "image/png") throw new Error(`the server answered ${blob.type || "no type"}, not a PNG`);
      node = el(`<img id="sw-plot-img" alt="Optimisation history: each completed trial's value and the best so far">`);
      node.src = await dataUrl(blob);
    }
  } catch (e) {
    if (e.message === "signed out") return;
    node = el(`<p class="error" id="sw-plot-na">${esc(e.message)}</p>`);
  }
  if (seq === latest() && document.body.contains(box)) box.replaceChildren(node);
}

const dataUrl = (blob) => new Promise((resolve, reject) => {
  const r = new FileReader();
  r.onload = () => resolve(r.result);
  r.onerror = () => reject(r.error || new Error("the plot could not be read"));
  r.readAsDataURL(blob);
});
