// The pollux-opt dashboard: reads the service's API (api/v1/...) and follows its
// event stream; no build step, no dependencies.  With a token set on the
// server, every request carries it (kept for this browser tab only).
"use strict";

const STATES = ["queued", "running", "rescaling", "succeeded", "failed", "cancelled"];
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const REFRESH_MS = 100;      // most frequent redraw: a burst of events is one refresh
const RECONNECT_MS = 1000;   // wait before following the event stream again
const CHARTS_MS = 2000;      // most frequent redraw of the charts (the server draws them)
const CHARTS_EVERY_MS = 15000;  // and at least this often: their time axis runs on to now
const LOG_KEEP_CHARS = 64 * 1024;  // the tail of a job's log the page keeps
const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                 "#9c755f", "#bab0ac"];  // Tableau 10

const view = { jobs: [], cluster: null, sortKey: "id", sortDir: 1, lastEventId: null, refreshTimer: null,
               chartsTimer: null, jobId: null, logAbort: null };

function token() { return sessionStorage.getItem("pollux-opt-token"); }

function setStatus(state, text) {
  const el = document.getElementById("status");
  el.dataset.state = state;
  el.textContent = text;
}

class Unauthorized extends Error {}

async function api(path, options = {}) {
  const headers = new Headers(options.headers || {});
  if (token()) headers.set("Authorization", `Bearer ${token()}`);
  const answer = await fetch(path, { ...options, headers });
  if (answer.status === 401) {
    document.getElementById("token-form").hidden = false;
    setStatus("error", token() ? "wrong token" : "this server needs a token");
    throw new Unauthorized();
  }
  return answer;
}

async function apiJson(path, options) {
  const answer = await api(path, options);
  const body = await answer.json();
  if (!answer.ok) throw new Error(body.error || `${answer.status}`);
  return body;
}

// ---------------------------------------------------------------- formatting
function num(v, digits = 1) { return v === null || v === undefined ? "-" : Number(v).toFixed(digits); }

function duration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "-";
  const s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return h ? `${h} h ${m} min` : m ? `${m} min ${s % 60} s` : `${s % 60} s`;
}

function jct(job) {  // seconds from submission to the end, or to now while it runs
  const end = job.end_t ?? (TERMINAL.has(job.state) ? null : Date.now() / 1000);
  return end === null ? null : end - job.submitted_unix;
}

function colourOf(jobId) {
  const i = view.jobs.findIndex(j => j.id === jobId);
  return PALETTE[(i < 0 ? 0 : i) % PALETTE.length];
}

// ---------------------------------------------------------------- jobs table
function sortValue(job, key) {
  if (key === "jct") return jct(job) ?? -1;
  if (key === "id") return Number(job.id);
  if (key === "state") return STATES.indexOf(job.state);
  const v = job[key];
  return v === null || v === undefined ? -Infinity : v;
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function actionButton(label, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.addEventListener("click", onClick);
  return b;
}

function tickTimes() {  // the running times advance between events: only their cells change
  const byId = new Map(view.jobs.map(j => [j.id, j]));
  for (const tr of document.querySelectorAll("#jobs tbody tr")) {
    const job = byId.get(tr.dataset.id);
    if (job && !TERMINAL.has(job.state)) tr.querySelector("td.jct").textContent = duration(jct(job));
  }
}

function renderJobs() {
  const filter = document.getElementById("state-filter").value;
  const rows = view.jobs.filter(j => !filter || j.state === filter);
  rows.sort((a, b) => view.sortDir * (sortValue(a, view.sortKey) > sortValue(b, view.sortKey) ? 1 :
                                      sortValue(a, view.sortKey) < sortValue(b, view.sortKey) ? -1 : 0));
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren(...rows.map(job => {
    const tr = document.createElement("tr");
    tr.dataset.id = job.id;
    tr.dataset.state = job.state;
    const batch = job.batch_size === null ? "-" :
      `${job.batch_size}${job.accum_steps > 1 ? ` (x${job.accum_steps})` : ""}`;
    const progress = job.progress === null ? "-" : num(job.progress, 0);
    const idCell = cell("", "id");
    idCell.append(actionButton(job.id, () => openJob(job.id)));
    tr.append(idCell, cell(job.name ?? job.kind), cell(job.cancelling && !TERMINAL.has(job.state) ?
              `${job.state} (cancelling)` : job.state, "state"), cell(num(job.weight, 2), "num"),
              cell(String(job.replicas), "num"), cell(String(job.nodes), "num"), cell(batch, "num"),
              cell(num(job.goodput), "num"), cell(num(job.speedup, 2), "num"), cell(progress, "num"),
              cell(duration(job.eta_s), "num"), cell(String(job.restarts), "num"), cell(duration(jct(job)), "num jct"));
    const actions = document.createElement("td");
    if (!TERMINAL.has(job.state) && !job.cancelling && view.cluster?.open_queue !== false) {
      actions.append(actionButton("cancel", () => cancelJob(job)), " ", actionButton("weight", () => setWeight(job)));
    }
    tr.append(actions);
    return tr;
  }));
  document.getElementById("jobs-empty").hidden = rows.length > 0;
  for (const th of document.querySelectorAll("#jobs th[data-key]")) {
    th.setAttribute("aria-sort", th.dataset.key === view.sortKey ? (view.sortDir > 0 ? "ascending" : "descending")
                                                                 : "none");
  }
}

async function cancelJob(job) {
  if (!confirm(`Cancel job ${job.id} (${job.name ?? job.kind})? It checkpoints if it can, then stops.`)) return;
  try {
    await apiJson(`api/v1/jobs/${encodeURIComponent(job.id)}/cancel`, { method: "POST" });
  } catch (err) {
    if (!(err instanceof Unauthorized)) alert(`Could not cancel job ${job.id}: ${err.message}`);
  }
  scheduleRefresh();
}

async function setWeight(job) {
  const answer = prompt(`New weight of job ${job.id} (its priority; now ${job.weight}):`, String(job.weight));
  if (answer === null || !confirm(`Set the weight of job ${job.id} to ${answer}?`)) return;
  try {
    await apiJson(`api/v1/jobs/${encodeURIComponent(job.id)}`, {
      method: "PATCH", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ weight: Number(answer) }),
    });
  } catch (err) {
    if (!(err instanceof Unauthorized)) alert(`Could not set the weight of job ${job.id}: ${err.message}`);
  }
  scheduleRefresh();
}

// ---------------------------------------------------------------- cluster
const SVG = "http://www.w3.org/2000/svg";
const CPU_PX = 18, GAP_PX = 3, LABEL_PX = 90, ROW_PX = 24;

function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function renderCluster() {
  const c = view.cluster;
  if (!c) return;
  const typed = new Set(c.nodes.map(n => n.type).filter(Boolean)).size > 1;
  const last = c.last_round ? `; last round ${new Date(c.last_round.t * 1000).toLocaleTimeString()}, ` +
    `decided in ${num(1000 * (c.last_round.solver_s ?? 0), 0)} ms` : "";
  document.getElementById("cluster-summary").textContent =
    `${c.allocated_cpus} of ${c.total_cpus} CPUs allocated, ${c.free_cpus} free${last}`;
  const svg = document.getElementById("cluster");
  const widest = Math.max(1, ...c.nodes.map(n => n.cpus));
  const width = LABEL_PX + widest * (CPU_PX + GAP_PX), height = c.nodes.length * ROW_PX;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", String(width));
  svg.setAttribute("height", String(height));
  const shapes = [];
  c.nodes.forEach((node, row) => {
    const y = row * ROW_PX;
    shapes.push(svgEl("text", { x: 0, y: y + CPU_PX - 4, "font-size": 12 }, typed ? `${node.id} (${node.type})` : node.id));
    const owners = [];
    for (const [jobId, placement] of Object.entries(c.holders)) {
      for (let k = 0; k < (placement[node.id] || 0); k++) owners.push(jobId);
    }
    for (let cpu = 0; cpu < node.cpus; cpu++) {
      const holder = owners[cpu];
      const rect = svgEl("rect", { x: LABEL_PX + cpu * (CPU_PX + GAP_PX), y, width: CPU_PX, height: CPU_PX, rx: 3,
                                   fill: holder ? colourOf(holder) : "var(--free)", "data-job": holder ?? "" });
      rect.append(svgEl("title", {}, holder ? `${node.id} CPU ${cpu}: job ${holder}` : `${node.id} CPU ${cpu}: free`));
      shapes.push(rect);
    }
  });
  svg.replaceChildren(...shapes);
  const legend = document.getElementById("cluster-legend");
  legend.replaceChildren(...Object.keys(c.holders).map(jobId => {
    const span = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = colourOf(jobId);
    span.append(swatch, `job ${jobId}`);
    return span;
  }));
}

// ---------------------------------------------------------------- one job
async function openJob(jobId) {
  if (view.logAbort) view.logAbort.abort();
  view.jobId = jobId;
  const panel = document.getElementById("job-panel");
  panel.hidden = false;
  document.getElementById("job-log").textContent = "";
  await Promise.all([renderJob(), refreshCharts()]);
  panel.scrollIntoView();
  followLog(jobId);
}

function closeJob() {
  if (view.logAbort) view.logAbort.abort();
  view.jobId = null;
  document.getElementById("job-panel").hidden = true;
}

async function renderJob() {
  if (view.jobId === null) return;
  try {
    const job = await apiJson(`api/v1/jobs/${encodeURIComponent(view.jobId)}`);
    document.getElementById("job-title").textContent =
      `Job ${job.id}: ${job.name ?? job.kind} (${job.state}; ${job.entry ?? job.kind})`;
    document.querySelector("#job-transitions tbody").replaceChildren(...job.transitions.map(m => {
      const tr = document.createElement("tr");
      tr.append(cell(new Date(m.t * 1000).toLocaleTimeString()), cell(m.old ?? "-"), cell(m.new), cell(m.reason ?? ""));
      return tr;
    }));
  } catch (err) {
    if (!(err instanceof Unauthorized)) setStatus("error", `cannot read job ${view.jobId}: ${err.message}`);
  }
}

// Rank 0's log from its start, followed until the job ends (or another job is opened).
async function followLog(jobId) {
  const abort = view.logAbort = new AbortController();
  const pre = document.getElementById("job-log");
  try {
    const answer = await api(`api/v1/jobs/${encodeURIComponent(jobId)}/logs?rank=0&follow=true`,
                             { signal: abort.signal });
    if (!answer.ok) return;
    const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      const text = pre.textContent + value;
      pre.textContent = text.length > LOG_KEEP_CHARS ? text.slice(-LOG_KEEP_CHARS) : text;
      pre.scrollTop = pre.scrollHeight;
    }
  } catch (err) {
    if (err.name !== "AbortError" && !(err instanceof Unauthorized)) pre.append(`\n[log: ${err.message}]`);
  }
}

// ---------------------------------------------------------------- refresh and live events
async function refresh() {
  view.refreshTimer = null;
  try {
    const [jobs, cluster] = await Promise.all([apiJson("api/v1/jobs"), apiJson("api/v1/cluster")]);
    view.jobs = jobs;
    view.cluster = cluster;
    renderJobs();
    renderCluster();
    await renderJob();
  } catch (err) {
    if (!(err instanceof Unauthorized)) setStatus("error", `cannot read the server: ${err.message}`);
  }
}

function scheduleRefresh() {
  if (view.refreshTimer === null) view.refreshTimer = setTimeout(refresh, REFRESH_MS);
  if (view.chartsTimer === null) view.chartsTimer = setTimeout(refreshCharts, CHARTS_MS);
}

// The charts come drawn (SVG) by the server from its own data; the viewer's time zone goes with the request.
async function refreshCharts() {
  view.chartsTimer = null;
  const tz = -new Date().getTimezoneOffset() * 60;
  const figures = [...document.querySelectorAll("figure[data-chart]")]
    .filter(f => f.dataset.job === undefined || view.jobId !== null);
  await Promise.all(figures.map(async figure => {
    const job = figure.dataset.job === undefined ? "" : `&job=${encodeURIComponent(view.jobId)}`;
    try {
      const answer = await api(`api/v1/charts/${figure.dataset.chart}?tz=${tz}${job}`);
      if (answer.ok) figure.innerHTML = await answer.text();
    } catch (err) {
      if (!(err instanceof Unauthorized)) setStatus("error", `cannot read the server: ${err.message}`);
    }
  }));
}

// Server-sent events read with fetch (EventSource cannot send a token), resumed
// from the last event's id after a drop or a server restart.
async function follow() {
  for (;;) {
    try {
      const headers = view.lastEventId === null ? {} : { "Last-Event-ID": view.lastEventId };
      const answer = await api("api/v1/events", { headers });
      if (!answer.ok) throw new Error(`${answer.status}`);
      setStatus("live", "live");
      await Promise.all([refresh(), refreshCharts()]);  // what happened while not following
      const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const message = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          for (const line of message.split("\n")) {
            if (line.startsWith("id: ")) view.lastEventId = line.slice(4);
          }
          if (message.includes("data: ")) scheduleRefresh();
        }
      }
      setStatus("connecting", "reconnecting");
    } catch (err) {
      if (err instanceof Unauthorized) return;  // the token form restarts following
      setStatus("error", "server unreachable: reconnecting");
    }
    await new Promise(resolve => setTimeout(resolve, RECONNECT_MS));
  }
}

function start() {
  for (const th of document.querySelectorAll("#jobs th[data-key]")) {
    th.addEventListener("click", () => {
      view.sortDir = th.dataset.key === view.sortKey ? -view.sortDir : 1;
      view.sortKey = th.dataset.key;
      renderJobs();
    });
  }
  document.getElementById("state-filter").addEventListener("change", renderJobs);
  document.getElementById("job-close").addEventListener("click", closeJob);
  document.getElementById("token-form").addEventListener("submit", event => {
    event.preventDefault();
    sessionStorage.setItem("pollux-opt-token", document.getElementById("token").value);
    document.getElementById("token-form").hidden = true;
    follow();
  });
  setInterval(tickTimes, 1000);
  setInterval(() => { if (view.chartsTimer === null) refreshCharts(); }, CHARTS_EVERY_MS);
  follow();
}

start();
