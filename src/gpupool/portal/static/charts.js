// The portal's charts: uPlot (installed from npm into vendor/ by scripts/build-portal, never committed), and
// the stacked bars of the quota and cost pages, which are a table's worth of rows, drawn as SVG.
import uPlot from "./vendor/uPlot.esm.js";
import { el, esc, fmt } from "./core.js";

const WIDTH = 900;

// A time series chart. points: [{at (Unix s), ...}], series: [{label, color, get(point)}].
// Returns its node, with .chart (the uPlot) and .push(point) to add a live point.
export function lineChart(points, series, { height = 200, unit = "", id = "" } = {}) {
  const box = el(`<div class="chart"${id ? ` id="${esc(id)}"` : ""}></div>`);
  const data = [points.map((p) => p.at), ...series.map((s) => points.map((p) => s.get(p)))];
  const chart = new uPlot({
    width: Math.min(WIDTH, Math.max(320, (document.getElementById("main")?.clientWidth || WIDTH) - 60)),
    height,
    series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.color, width: 2, spanGaps: false, value: (u, v) => (v === null || v === undefined ? "–" : `${fmt(v, 1)}${unit}`) }))],
    axes: [{}, { values: (u, ticks) => ticks.map((v) => `${v}${unit}`), size: 60 }],
    scales: { x: { time: true } },
  }, data, box);
  box.chart = chart;
  // How many points it holds and the newest values, as attributes: what a test (or a curious user) can read.
  const mark = () => { box.dataset.points = String(chart.data[0].length); box.dataset.last = series.map((s, i) => chart.data[i + 1].at(-1) ?? "").join(","); };
  box.push = (p) => {
    const [xs, ...ys] = chart.data;
    chart.setData([[...xs, p.at], ...ys.map((col, i) => [...col, series[i].get(p)])]);
    mark();
    box.querySelector(".empty")?.remove();
  };
  mark();
  if (!points.length) box.append(el(`<p class="reason empty">No samples in this period yet.</p>`));
  return box;
}

export function barChart(rows, bars, { width = WIDTH } = {}) {
  const max = Math.max(0.0001, ...rows.map((r) => bars.reduce((a, b) => a + b.get(r), 0)));
  const h = 26 * rows.length + 10;
  const body = rows.map((r, i) => {
    let x = 160;
    const parts = bars.map((b) => { const w = (b.get(r) / max) * (width - 260); const rect = `<rect x="${x}" y="${i * 26 + 4}" width="${w}" height="18" fill="${b.color}"/>`; x += w; return rect; }).join("");
    return `<text x="4" y="${i * 26 + 17}">${esc(r.key ?? r.queue)}</text>${parts}<text x="${x + 6}" y="${i * 26 + 17}">${fmt(bars.reduce((a, b) => a + b.get(r), 0))}</text>`;
  }).join("");
  return el(`<div><svg viewBox="0 0 ${width} ${h}" width="100%" role="img">${body}</svg>
    <div class="legend">${bars.map((b) => `<i style="background:${b.color}"></i>${esc(b.label)}`).join("")}</div></div>`);
}

// Each department's burst spending this month against its budget: spent (solid) over the month's forecast at its
// pace (pale), the budget a red mark. lines: the usage report's budget lines.
export function budgetChart(lines, { width = WIDTH } = {}) {
  const max = Math.max(0.0001, ...lines.map((b) => Math.max(b.spent, b.forecast, b.monthly_budget ?? 0)));
  const scale = (x) => (x / max) * (width - 480); // room on the right for the figures
  const h = 26 * lines.length + 10;
  const body = lines.map((b, i) => {
    const y = i * 26 + 4;
    const mark = b.monthly_budget === null ? "" : `<line class="budget" x1="${160 + scale(b.monthly_budget)}" x2="${160 + scale(b.monthly_budget)}" y1="${y - 3}" y2="${y + 21}" stroke="#c0392b" stroke-width="2"/>`;
    const over = b.monthly_budget !== null && b.forecast > b.monthly_budget ? " over budget" : "";
    return `<g data-department="${esc(b.department)}"><text x="4" y="${y + 13}">${esc(b.department)}</text>
      <rect class="forecast" x="160" y="${y}" width="${scale(b.forecast)}" height="18" fill="#c7d7f5"/>
      <rect class="spent" x="160" y="${y}" width="${scale(b.spent)}" height="18" fill="#2b6cb0"/>${mark}
      <text x="${160 + scale(Math.max(b.forecast, b.monthly_budget ?? 0)) + 6}" y="${y + 13}">$${fmt(b.spent)} of ${b.monthly_budget === null ? "no budget" : `$${fmt(b.monthly_budget)}`}, forecast $${fmt(b.forecast)}${over}</text></g>`;
  }).join("");
  return el(`<div class="budget-chart"><svg viewBox="0 0 ${width} ${h}" width="100%" role="img">${body}</svg>
    <div class="legend"><i style="background:#2b6cb0"></i>spent this month<i style="background:#c7d7f5"></i>forecast at this pace<i style="background:#c0392b"></i>monthly budget</div></div>`);
}
