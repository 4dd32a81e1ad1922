// The dashboard's pages: everything shown comes from /api/v1 and /api/v1/events.

const $ = (id) => document.getElementById(id);
const ROW = 24; // px per node row: only the rows in view are drawn
const state = { nodes: [], tab: "cluster", events: [], kinds: new Set(), skipped: 0, drawing: false };

async function api(path) {
  const r = await fetch(path, { headers: { accept: "application/json" } });
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return r.json();
}

// Everything shown comes from the cluster or an operator's files: never markup.
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

function gpus(milli) {
  const g = milli / 1000;
  return Number.isInteger(g) ? String(g) : g.toFixed(1);
}

function text(el, value) {
  if (el.textContent !== value) el.textContent = value;
}

// Tabs: click or arrow keys; one panel shown.
function select(tab) {
  state.tab = tab;
  for (const b of document.querySelectorAll('[role="tab"]')) {
    const on = b.getAttribute("aria-controls") === tab;
    b.setAttribute("aria-selected", String(on));
    b.tabIndex = on ? 0 : -1;
    $(b.getAttribute("aria-controls")).hidden = !on;
  }
  refresh();
}

function setupTabs() {
  const tabs = [...document.querySelectorAll('[role="tab"]')];
  tabs.forEach((b, i) => {
    b.addEventListener("click", () => {
      history.replaceState(null, "", `#/${b.getAttribute("aria-controls")}`);
      select(b.getAttribute("aria-controls"));
    });
    b.addEventListener("keydown", (e) => {
      const d = e.key === "ArrowRight" ? 1 : e.key === "ArrowLeft" ? -1 : 0;
      if (!d) return;
      const shown = tabs.filter((t) => !t.hidden);
      const at = shown.indexOf(b);
      const next = shown[(at + d + shown.length) % shown.length];
      next.focus();
      select(next.getAttribute("aria-controls"));
    });
  });
}

// Charts: uPlot (vendored, `assets/vendor/`), one per figure, made again only when its lines or
// width change; otherwise it takes the new data.
const charts = new Map();

/** Draws `lines` ({label, stroke, values}) over `xs` in element `id`, axes labelled `x` and `y`. */
function chart(id, xs, lines, { x, y, range }) {
  const el = $(id);
  const width = Math.max(320, el.clientWidth - 2);
  const key = JSON.stringify([lines.map((l) => [l.label, l.stroke]), x, y, range, width]);
  const data = [xs, ...lines.map((l) => l.values)];
  const shown = charts.get(id);
  if (shown?.key === key) {
    shown.plot.setData(data);
    return;
  }
  shown?.plot.destroy();
  const plot = new globalThis.uPlot({
    width, height: 180,
    scales: { x: { time: false }, y: range ? { range } : {} },
    axes: [{ label: x }, { label: y }],
    series: [{ label: x }, ...lines.map((l) => ({ label: l.label, stroke: l.stroke, width: 2, spanGaps: true }))],
  }, data, el);
  charts.set(id, { key, plot });
}

/** The cluster's allocation (and, from the simulator, FGD's fragmentation) over its clock. */
function drawHistory(series, xLabel) {
  const frag = series.some((p) => p.fragmentation_percent != null);
  $("frag-key").hidden = !frag;
  text($("history-x"), xLabel || "time");
  const lines = [{ label: "allocated", stroke: "#0b3d75", values: series.map((p) => p.allocation_percent) }];
  if (frag) lines.push({ label: "fragmented", stroke: "#c64600", values: series.map((p) => p.fragmentation_percent) });
  chart("history", series.map((p) => p.at), lines, { x: xLabel || "time", y: "% of GPUs", range: [0, 100] });
}

async function loadNodes() {
  const model = $("model-filter").value, label = $("label-filter").value.trim(), queue = $("queue-filter").value;
  const nodes = [];
  for (let offset = 0; ; offset += 1000) {
    const q = new URLSearchParams({ offset, limit: 1000 });
    if (model) q.set("model", model);
    if (label) q.set("label", label);
    if (queue) q.set("queue", queue);
    const page = await api(`/api/v1/nodes?${q}`);
    nodes.push(...page.nodes);
    if (nodes.length >= page.total || page.nodes.length === 0) break;
  }
  state.nodes = nodes;
  text($("shown-count"), `${nodes.length} shown`);
  $("nodes-inner").style.height = `${nodes.length * ROW}px`;
  drawRows();
}

function gpuCell(g) {
  const cls = g.health !== "Healthy" ? "gpu bad" : g.used_milli >= 1000 ? "gpu full" : g.used_milli > 0 ? "gpu part" : "gpu free";
  return `<span class="${cls}" title="GPU ${g.index}: ${g.used_milli / 10}% used${g.health !== "Healthy" ? ", " + g.health : ""}"></span>`;
}

/** A DRA device: held or free, a MIG partition drawn smaller. */
function deviceCell(d) {
  const cls = `gpu dra${d.kind === "mig" ? " mig" : ""} ${d.held_by.length ? "full" : "free"}`;
  const what = [d.kind, d.profile, d.model].filter(Boolean).join(" ");
  return `<span class="${cls}" title="${esc(`${d.id}${what ? ` (${what})` : ""}: ${d.held_by.length ? `held by ${d.held_by.join(", ")}` : "free"}`)}"></span>`;
}

/** A device plugin's MIG partitions of one profile: a small square per partition, the used ones filled. */
function partitionCells(p) {
  const cell = (used) => `<span class="gpu mig ${used ? "full" : "free"}"></span>`;
  return `<span class="partitions" title="${esc(`MIG ${p.profile}: ${p.used} of ${p.total} in use (device plugin)`)}">` +
    Array.from({ length: Math.min(p.total, 64) }, (_, i) => cell(i < p.used)).join("") + "</span>";
}

// A node's GPUs: the model, and the vendor when it is not NVIDIA's (the default kind).
function modelOf(n) {
  if (!n.model && !n.kind) return "no GPU";
  return [n.model || "unknown", n.kind && n.kind !== "nvidia" ? n.kind : ""].filter(Boolean).join(" · ");
}

function drawRows() {
  const box = $("nodes"), inner = $("nodes-inner");
  const first = Math.floor(box.scrollTop / ROW), count = Math.ceil(box.clientHeight / ROW) + 2;
  const rows = state.nodes.slice(first, first + count).map((n, i) =>
    `<div class="node-row" role="button" tabindex="0" data-name="${esc(n.name)}" data-row="${first + i}">` +
    `<span class="name">${esc(n.name)}</span><span class="model">${esc(modelOf(n))}</span>` +
    `<span class="gpus">${n.gpus.map(gpuCell).join("")}${n.devices.map(deviceCell).join("")}${n.partitions.map(partitionCells).join("")}</span></div>`);
  if (redraw(inner, rows.join(""))) {
    // Placed through the CSSOM: the page's CSP allows no inline style attributes.
    for (const row of inner.children) row.style.top = `${row.dataset.row * ROW}px`;
  }
}

/**
 * Puts `html` into `el` when it differs from what `el` shows; says whether it did. The pages
 * refresh every second, so unchanged rows are left alone (focus, hover, a selection and a click in
 * progress stay where they are), and a redraw gives the keyboard focus back to the row of the same
 * name: a keyboard user never loses their place to a refresh.
 */
function redraw(el, html) {
  if (el.dataset.drawn === html) return false;
  const focused = el.contains(document.activeElement) ? document.activeElement.closest("[data-name]")?.dataset.name : null;
  el.innerHTML = html;
  el.dataset.drawn = html;
  if (focused != null) el.querySelector(`[data-name="${CSS.escape(focused)}"]`)?.focus();
  return true;
}

async function showNode(name) {
  const n = await api(`/api/v1/nodes/${encodeURIComponent(name)}`);
  const d = $("node-detail");
  d.hidden = false;
  d.innerHTML = `<h2>${esc(n.name)}</h2><p>${esc(modelOf(n))} · CPU ${n.cpu_used_milli / 1000}/${n.cpu_milli / 1000}` +
    `${n.unschedulable ? " · cordoned" : ""}</p><ul class="gpu-list">` +
    n.gpus.map((g) => `<li>${gpuCell(g)} GPU ${g.index}: ${g.used_milli / 10}% used` +
      `${g.numa_node != null ? `, NUMA ${g.numa_node}` : ""}${g.memory_bytes ? `, ${(g.memory_bytes / 2 ** 30).toFixed(0)} GiB` : ""}</li>`).join("") +
    `</ul>${n.devices.length ? `<h3>DRA devices (${n.devices.length})</h3><ul class="device-list">` +
      n.devices.map((v) => `<li>${deviceCell(v)} <code>${esc(v.id)}</code> ${esc([v.kind, v.profile, v.model].filter(Boolean).join(" · "))}: ` +
        `${v.held_by.length ? `held by ${esc(v.held_by.join(", "))}` : "free"}</li>`).join("") + "</ul>" : ""}` +
    `${n.partitions.length ? `<h3>MIG partitions (device plugin)</h3><ul class="partition-list">` +
      n.partitions.map((p) => `<li>${partitionCells(p)} ${esc(p.profile)}: ${p.used} of ${p.total} in use</li>`).join("") + "</ul>" : ""}` +
    `${n.topology ? `<h3>Topology</h3><pre class="topology">${esc(n.topology)}</pre>` : ""}<h3>Tasks (${n.tasks.length})</h3><ul class="task-list">` +
    n.tasks.map((t) => `<li>${esc(t.name)} <span class="muted">(${esc(t.queue)})</span></li>`).join("") +
    `</ul><h3>Labels</h3><ul>${n.labels.map(([k, v]) => `<li><code>${esc(k)}=${esc(v)}</code></li>`).join("")}</ul>`;
}

async function refreshCluster() {
  const c = await api("/api/v1/cluster");
  text($("source"), `${c.source} · t=${c.atSeconds}s`);
  text($("node-count"), String(c.cluster.nodes));
  text($("gpu-count"), String(c.cluster.gpus));
  const pct = c.cluster.gpu_milli_total ? (100 * c.cluster.gpu_milli_used) / c.cluster.gpu_milli_total : 0;
  text($("allocation"), `${pct.toFixed(1)} %`);
  text($("shared-count"), String(c.cluster.gpus_shared));
  text($("placed-count"), String(c.cluster.placed));
  text($("waiting-count"), String(c.cluster.waiting));
  const parts = c.cluster.partitions ?? [];
  $("partitions-total").hidden = parts.length === 0;
  text($("partition-count"), parts.map((p) => `${p.profile} ${p.used}/${p.total}`).join(", "));
  const sel = $("model-filter");
  for (const m of c.cluster.models) {
    if (![...sel.options].some((o) => o.value === m.model)) sel.add(new Option(`${modelOf(m)} (${m.gpus})`, m.model));
  }
  drawHistory(c.series, c.series_x);
  drawDomains(c.domains ?? []);
  fillQueueFilter((await api("/api/v1/queues")).queues);
  await loadNodes();
}

/** The topology domains of each level; a whole one (every node idle) is marked. */
function drawDomains(domains) {
  $("domains-table").hidden = domains.length === 0;
  redraw($("domain-rows"), domains.map((d) => {
    const whole = d.idle_nodes === d.nodes;
    return `<tr class="domain${whole ? " whole" : ""}" role="button" tabindex="0" data-name="${esc(`${d.level}=${d.name.split("/")[0]}`)}">` +
      `<td>${esc(d.level)}</td><td>${esc(d.name)}${whole ? " (whole)" : ""}</td><td>${d.idle_nodes} / ${d.nodes}</td>` +
      `<td>${gpus(d.free_gpu_milli)} / ${d.gpus}</td></tr>`;
  }).join(""));
}

/** A domain's nodes: the node list filtered by its innermost label. */
function showDomain(filter) {
  $("label-filter").value = filter;
  loadNodes();
}

/** A queue's share over time: GPUs allocated and deserved, on one scale. */
async function showQueue(name) {
  const { queue, history } = await api(`/api/v1/queues/${encodeURIComponent(name)}`);
  $("queue-detail").hidden = false;
  text($("queue-name"), queue.name);
  const top = Math.max(1, ...history.map((p) => Math.max(p.allocated_gpu_milli, p.deserved_gpu_milli ?? 0)));
  const x0 = history.length ? history[0].at : 0, x1 = history.length ? history[history.length - 1].at : 0;
  const of = (key) => history.map((p) => (p[key] == null ? null : p[key] / 1000));
  chart("queue-history", history.map((p) => p.at), [
    { label: "allocated", stroke: "#0b3d75", values: of("allocated_gpu_milli") },
    { label: "deserved", stroke: "#2e7d32", values: of("deserved_gpu_milli") },
  ], { x: "seconds", y: "GPUs" });
  text($("queue-span"), `${history.length} samples over ${x1 - x0} s, up to ${gpus(top)} GPUs`);
}

/** The cluster page's queue filter offers every queue the source knows. */
function fillQueueFilter(queues) {
  const sel = $("queue-filter");
  for (const q of queues) {
    if (![...sel.options].some((o) => o.value === q.name)) sel.add(new Option(q.name, q.name));
  }
}

/** A resource's guarantee and cap after its allocated / deserved, where the queue has them. */
function quota(guarantee, cap, borrowed, lent, f) {
  return (guarantee ? ` · guaranteed ${f(guarantee)}` : "") + (cap != null ? ` · cap ${f(cap)}` : "") +
    (borrowed ? ` · borrowed ${f(borrowed)}` : "") + (lent ? ` · lent ${f(lent)}` : "");
}

async function refreshQueues() {
  const { queues } = await api("/api/v1/queues");
  fillQueueFilter(queues);
  // Served first, in the order fair share serves the leaves; then the rest in tree order.
  const order = (q) => q.served ?? Number.MAX_SAFE_INTEGER;
  const rows = queues.map((q, i) => [q, i]).sort(([a, i], [b, j]) => order(a) - order(b) || i - j).map(([q]) => q);
  const opt = (v, f) => (v == null ? "–" : f(v));
  const cores = (m) => (m / 1000).toLocaleString("en", { maximumFractionDigits: 1 });
  const gib = (b) => (b / 2 ** 30).toLocaleString("en", { maximumFractionDigits: 1 });
  redraw($("queue-rows"), rows.map((q) => `<tr class="queue" role="button" tabindex="0" data-name="${esc(q.name)}"><td>${esc(q.name)}</td><td>${esc(q.parent)}</td>` +
    `<td class="served">${q.served ?? ""}</td><td>${q.weight}</td><td>${gpus(q.allocated_gpu_milli)}</td>` +
    `<td>${opt(q.deserved_gpu_milli, gpus)}</td><td>${gpus(q.guarantee_gpu_milli)}</td><td class="borrowed">${gpus(q.borrowed_gpu_milli)}</td>` +
    `<td class="lent">${gpus(q.lent_gpu_milli)}${q.lending_limit_gpu_milli != null ? ` (limit ${gpus(q.lending_limit_gpu_milli)})` : ""}</td>` +
    `<td>${opt(q.capability_gpu_milli, gpus)}</td>` +
    `<td class="cpu">${cores(q.allocated_cpu_milli)} / ${opt(q.deserved_cpu_milli, cores)}${quota(q.guarantee_cpu_milli, q.capability_cpu_milli, q.borrowed_cpu_milli, q.lent_cpu_milli, cores)}</td>` +
    `<td class="memory">${gib(q.allocated_memory_bytes)} / ${opt(q.deserved_memory_bytes, gib)}${quota(q.guarantee_memory_bytes, q.capability_memory_bytes, q.borrowed_memory_bytes, q.lent_memory_bytes, gib)}</td>` +
    `<td>${q.pending}</td><td>${q.running}</td></tr>`).join(""));
}

/** Seconds as the largest two units: "45 s", "3 min 20 s", "2 h 5 min", "3 d 4 h". */
function duration(s) {
  const units = [["d", 86400], ["h", 3600], ["min", 60], ["s", 1]];
  const parts = [];
  for (const [name, size] of units) {
    if (s >= size || (name === "s" && parts.length === 0)) {
      parts.push(`${Math.floor(s / size)} ${name}`);
      s %= size;
    }
    if (parts.length === 2) break;
  }
  return parts.join(" ");
}

async function refreshPending() {
  const { workloads } = await api("/api/v1/workloads");
  $("workload-rows").innerHTML = workloads.map((w) => `<tr class="workload"><td>${esc(w.name)}</td><td>${esc(w.queue)}</td><td>${esc(w.phase)}</td>` +
    `<td>${w.placed} / ${w.min_member} / ${w.members}</td><td class="place">${w.queue_position ?? ""}</td>` +
    `<td class="waiting">${w.waiting_seconds == null ? "" : duration(w.waiting_seconds)}</td><td class="reason">${esc(w.reason)}</td></tr>`).join("");
}

/** One stage's line: calls, mean and p99 latency, and its faults (marked) if any. */
function stageCalls(s) {
  const us = (v) => (v >= 1000 ? `${(v / 1000).toFixed(1)} ms` : `${Math.round(v)} µs`);
  const faults = s.faults.map((f) => `${f.count} ${f.kind}`).join(", ");
  return esc(`${s.stage}: ${s.calls.toLocaleString("en")} calls · mean ${us(s.mean_us)} · p99 ${us(s.p99_us)}`) +
    (faults ? ` · <span class="fault">faults: ${esc(faults)}</span>` : "");
}

const percent = (share) => `${(100 * share).toLocaleString("en", { maximumFractionDigits: 1 })} %`;

/** The rollout: probation and the live window, a candidate in shadow, the versions' history. */
function showRollout(r) {
  $("rollout").hidden = !r;
  if (!r) return;
  const w = r.live_window;
  const window = w ? `; last window: ${w.decisions.toLocaleString("en")} decisions, ${percent(w.fault_rate)} faulted, ` +
    `${percent(w.unschedulable_rate)} unschedulable, p99 ${w.p99_ms.toFixed(2)} ms` : "";
  text($("rollout-state"), `${r.live}: ${r.on_probation ? "on probation" : "live"}; rollback restores ${r.last_good ?? "–"}${window}` +
    (r.source_errors.length ? `; source errors: ${r.source_errors.map(([s, e]) => `${s}: ${e}`).join("; ")}` : ""));
  const s = r.shadow;
  text($("rollout-candidate"), !r.candidate ? "No candidate." : `Candidate ${r.candidate}` + (s ?
    ` in shadow for ${Math.round(s.seconds)} s: ${s.compared.toLocaleString("en")} decisions compared, ${percent(s.identical_share)} on the same node, ` +
    `${percent(s.fault_rate)} faulted, mean score difference ${s.mean_score_delta.toFixed(1)}` : " ready to promote."));
  const diffs = s?.recent_differences ?? [];
  $("shadow-table").hidden = diffs.length === 0;
  $("shadow-rows").innerHTML = diffs.map((x) => `<tr class="difference"><td>${esc(x.task?.id)}</td>` +
    `<td>${esc(nodeAndScore(x.live, x.live_score))}</td><td>${esc(nodeAndScore(x.shadow, x.shadow_score))}</td></tr>`).join("");
  $("history-rows").innerHTML = r.history.map((h) => `<tr class="version"><td>${esc(h.label)}</td><td class="outcome">${esc(h.outcome)}</td>` +
    `<td>${esc(h.reason)}</td><td>${esc(new Date(h.at * 1000).toISOString().replace("T", " ").slice(0, 19))}</td><td>${esc(h.origin)}</td></tr>`).join("");
}

async function refreshPolicies() {
  const { policies } = await api("/api/v1/policies");
  text($("policy-name"), policies ? `${policies.name} v${policies.version}` : "no policy set");
  $("plugin-rows").innerHTML = (policies?.plugins ?? []).map((p) => `<tr><td>${esc(p.name)}</td><td>${esc(p.stages.join(", "))}</td>` +
    `<td class="budget">${p.budget ? esc(`${p.budget.deadline_ms} ms CPU · ${p.budget.memory_mib} MiB · ${p.budget.failure}`) : ""}</td>` +
    `<td class="calls">${(p.calls ?? []).map(stageCalls).join("<br>")}</td><td><code>${esc(p.digest)}</code></td></tr>`).join("");
  showRollout(policies?.rollout);
}

// Policies' lines in the experiment chart: distinct, dark enough on white.
const PALETTE = ["#0b3d75", "#c64600", "#2e7d32", "#6a1b9a", "#00695c", "#ad1457", "#4e342e", "#37474f"];

/** The experiment grid: progress while it runs, then its table and a trace's curves. */
async function refreshExperiments() {
  const { experiments: x } = await api("/api/v1/experiments");
  $("tab-experiments").hidden = !x;
  if (!x) return;
  text($("experiment-progress"), x.rows.length ? `${x.total.toLocaleString("en")} experiments: ${x.traces.length} traces × ${x.policies.length} policies × ${x.seeds} seeds`
    : `running: ${x.done.toLocaleString("en")} of ${x.total.toLocaleString("en")} experiments`);
  const row = (t, p) => x.rows.find((r) => r.trace === t && r.policy === p);
  $("experiment-head").innerHTML = `<tr><th scope="col">Trace</th>${x.policies.map((p) => `<th scope="col">${esc(p)}</th>`).join("")}</tr>`;
  $("experiment-rows").innerHTML = x.rows.length === 0 ? "" : x.traces.map((t) => {
    const best = Math.max(...x.policies.map((p) => row(t, p)?.at_130?.[0] ?? -Infinity));
    return `<tr class="experiment" data-name="${esc(t)}"><th scope="row">${esc(t)}</th>` + x.policies.map((p) => {
      const v = row(t, p)?.at_130;
      return v ? `<td${v[0] === best ? ' class="best"' : ""}>${v[0].toFixed(2)} ± ${v[1].toFixed(2)}</td>` : "<td>–</td>";
    }).join("") + "</tr>";
  }).join("");
  const pick = $("experiment-trace");
  if (pick.options.length !== x.traces.length) pick.innerHTML = x.traces.map((t) => `<option>${esc(t)}</option>`).join("");
  const trace = pick.value || x.traces[0];
  // Where the policies differ: from 80 % of capacity arrived on, the allocation axis fitted to the
  // curves there (the whole 0–130 % is a diagonal they share until the cluster fills).
  const FROM = 80, TO = 130;
  const xs = Array.from({ length: TO - FROM + 1 }, (_, i) => FROM + i);
  const curves = x.policies.map((p) => xs.map((a) => row(trace, p)?.allocation?.[a] ?? null));
  const values = curves.flat().filter((v) => v != null);
  const lo = values.length ? Math.floor(Math.min(...values)) : 0, hi = values.length ? Math.ceil(Math.max(...values)) : 100;
  chart("experiment-chart", xs, x.policies.map((p, i) => ({ label: p, stroke: PALETTE[i % PALETTE.length], values: curves[i] })),
    { x: "capacity arrived (%)", y: "GPUs allocated (%)", range: [lo, Math.max(hi, lo + 1)] });
  text($("experiment-axes"), `GPU allocated (%, ${lo}–${hi}) by capacity arrived (%, ${FROM}–${TO}), one line per policy`);
  const c = await api("/api/v1/cluster");
  text($("source"), c.source);
}

/** The last point of `series` at or before `x`, while `x` is within it: a curve as a step line. */
function stepAt(series, x) {
  if (series.length === 0 || x > series[series.length - 1].at) return null;
  let lo = 0, hi = series.length - 1, found = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (series[mid].at <= x) { found = mid; lo = mid + 1; } else hi = mid - 1;
  }
  return found < 0 ? null : series[found];
}

/** `v` rounded to `digits`, "–" when absent (and never "-0"). */
const fixed = (v, digits = 2) => v == null ? "–"
  : (Math.abs(v) < 0.5 * 10 ** -digits ? 0 : Number(v)).toLocaleString("en", { maximumFractionDigits: digits });
const placement = (p) => `${p.node} at ${p.at.toLocaleString("en")} s, GPUs ${p.gpus.map(([g, m]) => `${g}×${m / 1000}`).join(", ") || "none"}`;

/** Two policy sets replayed on the same input: both replays as they go, then the comparison. */
async function refreshCompare() {
  const { comparison: x } = await api("/api/v1/comparison");
  $("tab-compare").hidden = !x;
  if (!x) return;
  const [a, b] = x.sides, r = x.result;
  text($("compare-a"), `A: ${a.set}`);
  text($("compare-b"), `B: ${b.set}`);
  const side = (s) => `${s.set} ${s.finished ? "finished" : "at"} ${s.at_seconds.toLocaleString("en")} virtual s, ` +
    `${s.arrived.toLocaleString("en")} of ${x.jobs.toLocaleString("en")} jobs arrived, ${s.placed.toLocaleString("en")} tasks placed`;
  text($("compare-progress"), r ? `${x.jobs.toLocaleString("en")} jobs replayed with A = ${a.set} and B = ${b.set}`
    : `running: A ${side(a)}; B ${side(b)}`);
  const figures = r ? r.figures : [
    { name: "virtual seconds replayed", a: a.at_seconds, b: b.at_seconds },
    { name: "jobs arrived", a: a.arrived, b: b.arrived },
    { name: "tasks placed", a: a.placed, b: b.placed },
  ];
  $("compare-figures").innerHTML = figures.map((f) => `<tr class="figure"><th scope="row">${esc(f.name)}</th><td>${fixed(f.a)}</td>` +
    `<td>${fixed(f.b)}</td><td>${f.a == null || f.b == null ? "–" : fixed(f.b - f.a)}</td></tr>`).join("");
  // One x axis for both: the longer replay's span in 500 steps, each side's curve as it stood then.
  const key = $("compare-curve").value;
  const end = Math.max(a.at_seconds, b.at_seconds, 1);
  const hours = end > 36000, unit = hours ? 3600 : 1;
  const xs = Array.from({ length: 501 }, (_, i) => Math.round((end * i) / 500));
  const line = (s, i) => ({ label: `${i ? "B" : "A"}: ${s.set}`, stroke: PALETTE[i], values: xs.map((t) => stepAt(s.series, t)?.[key] ?? null) });
  chart("compare-chart", xs.map((t) => t / unit), [line(a, 0), line(b, 1)],
    { x: hours ? "virtual hours" : "virtual seconds", y: "% of GPUs" });
  text($("compare-axes"), `${$("compare-curve").selectedOptions[0].textContent}, percent of capacity, by ${hours ? "virtual hours" : "virtual seconds"}; one line per policy set`);
  $("compare-details").hidden = !r;
  if (r) {
    $("compare-queues").innerHTML = Object.entries(r.queue_delay_mean).map(([q, [da, db]]) => `<tr class="queue-delay"><th scope="row">${esc(q)}</th>` +
      `<td>${fixed(da, 1)}</td><td>${fixed(db, 1)}</td><td>${fixed(db - da, 1)}</td></tr>`).join("");
    const both = r.placements_same + r.placements_differ;
    text($("compare-placements"), `Placements: ${r.placements_differ.toLocaleString("en")} of ${both.toLocaleString("en")} tasks both placed differ under B: ` +
      `${r.placements_other_node.toLocaleString("en")} on another node, ${r.placements_other_gpus.toLocaleString("en")} on other GPUs of the same node, ` +
      `${r.placements_other_time.toLocaleString("en")} only at another time.`);
    $("compare-differing").innerHTML = r.differing.map((d) => `<tr class="difference"><td>${esc(d.task)}</td><td>${esc(placement(d.a))}</td>` +
      `<td>${esc(placement(d.b))}</td></tr>`).join("");
    const only = (list, by) => list.slice(0, 20).map((o) => `<tr class="only"><td>${esc(o.job)}</td><td>${esc(o.queue)}</td><td>${by}</td>` +
      `<td class="reason">${esc(o.other_reason)}</td></tr>`).join("");
    $("compare-only").innerHTML = only(r.started_only_by_a, "A") + only(r.started_only_by_b, "B");
  }
  const c = await api("/api/v1/cluster");
  text($("source"), c.source);
}

const ref = (set) => set ? `${set.name}@${set.version}` : "–";
const nodeAndScore = (n, score) => n ? `${n}${score != null ? ` (${score})` : ""}` : "unschedulable";

/** What one event says, in a line: its kind's own fields (docs/events.md). */
function what(kind, d) {
  switch (kind) {
    case "task-scheduled": return `GPUs ${(d.gpus ?? []).map((g) => `${g.gpu}×${g.milli / 1000}`).join(", ") || "none"}; score ${d.score?.total ?? "–"} of ${d.score?.feasible ?? "–"} feasible nodes; ${ref(d.policy_set)}`;
    case "task-unschedulable": return (d.reasons ?? []).map((r) => `${r.stage}: ${r.reason} (${r.nodes} nodes)`).join("; ") + ` — attempt ${d.attempt}`;
    case "task-preempted": return `${d.reason} for ${d.preemptor?.id ?? "–"}; checkpoint ${d.checkpoint}`;
    case "task-evicted": case "task-ended": return d.reason ?? "";
    case "task-topology-alert": return `${d.severity}: ${d.message}`;
    case "task-withdrawn": return `withdrawn after ${d.waited_seconds} s waiting`;
    case "group-timed-out": return `${d.placed} of ${d.min_member} placed after ${d.waited_seconds} s`;
    case "queue-share-changed": {
      // What moved: GPUs, CPU cores, memory GiB (a share moves in any of them).
      const dims = [["gpu_milli", "GPUs", gpus], ["cpu_milli", "CPU cores", (m) => String(m / 1000)],
        ["memory_bytes", "GiB", (b) => (b / 2 ** 30).toFixed(1)]];
      const moved = dims.filter(([k]) => (d.previous?.[k] ?? 0) !== (d.deserved?.[k] ?? 0));
      return "deserved " + (moved.length ? moved : dims.slice(0, 1)).map(([k, unit, f]) =>
        `${f(d.previous?.[k] ?? 0)} → ${f(d.deserved?.[k] ?? 0)} ${unit}`).join(", ") + `; allocated ${gpus(d.allocated?.gpu_milli ?? 0)} GPUs`;
    }
    case "policy-loaded": return `${ref(d.policy_set)}: ${(d.plugins ?? []).map((p) => p.name).join(", ")}`;
    case "policy-swapped": return `${ref(d.from)} → ${ref(d.to)}`;
    case "policy-rolled-back": return `${ref(d.from)} → ${ref(d.to)}: ${d.reason}`;
    case "policy-rejected": return `${ref(d.policy_set)} failed ${d.gate}: ${d.reason}`;
    case "policy-shadow-diff": return `${ref(d.shadow)} vs ${ref(d.live)}: ${d.differing} of ${d.decisions} differ` +
      (d.examples ?? []).slice(0, 3).map((x) => `; ${x.task?.id}: ${nodeAndScore(x.live)} / ${nodeAndScore(x.shadow)}`).join("");
    case "plugin-fault": return `${d.plugin} ${d.stage}: ${d.fault} — ${d.message}`;
    case "events-dropped": return `${d.count} events dropped: ${d.reason}`;
    default: return JSON.stringify(d).slice(0, 200);
  }
}

/** An event of the stream as a row: CloudEvents envelope → kind, task, node, queue, summary. */
function decision(json) {
  let e;
  try { e = JSON.parse(json); } catch { return null; }
  // io.wasmsched.task.scheduled.v1 → task-scheduled (the kinds of `events tail --kind`).
  const kind = String(e.type ?? "").replace(/^io\.wasmsched\./, "").replace(/\.v\d+$/, "").replace(".", "-");
  const d = e.data ?? {};
  const task = d.task ?? d.victim;
  return {
    time: String(e.time ?? "").replace("T", " ").replace("Z", ""), kind,
    task: task?.id ?? d.group ?? e.subject ?? "", node: d.node ?? "",
    queue: task?.queue ?? d.queue ?? "", what: what(kind, d),
  };
}

function drawEvents() {
  const kind = $("event-kind").value;
  const has = (id, v) => { const f = $(id).value.trim(); return !f || v.includes(f); };
  const shown = state.events.filter((e) => (!kind || e.kind === kind) &&
    has("event-queue", e.queue) && has("event-node", e.node) && has("event-task", e.task));
  text($("event-count"), shown.length.toLocaleString("en"));
  $("event-rows").innerHTML = shown.slice(0, 200).map((e) => `<tr class="event"><td>${esc(e.time)}</td><td class="kind">${esc(e.kind)}</td>` +
    `<td class="task">${esc(e.task)}</td><td class="node">${esc(e.node)}</td><td>${esc(e.queue)}</td><td class="what">${esc(e.what)}</td></tr>`).join("");
}

function follow() {
  const source = new EventSource("/api/v1/events");
  source.addEventListener("decision", (m) => {
    const e = decision(m.data);
    if (!e) return;
    state.events.unshift(e);
    state.events.length = Math.min(state.events.length, 1000);
    if (!state.kinds.has(e.kind)) {
      state.kinds.add(e.kind);
      const pick = $("event-kind"), chosen = pick.value;
      pick.innerHTML = `<option value="">all</option>` + [...state.kinds].sort().map((k) => `<option value="${esc(k)}">${esc(k)}</option>`).join("");
      pick.value = chosen;
    }
    if (state.tab === "decisions" && !state.drawing) {
      // One redraw per frame however fast events come.
      state.drawing = true;
      requestAnimationFrame(() => { state.drawing = false; drawEvents(); });
    }
  });
  source.addEventListener("lagged", (e) => text($("event-status"), `${e.data} events missed (this page fell behind)`));
  source.addEventListener("skipped", (e) => {
    state.skipped += Number(e.data);
    text($("event-status"), `live; ${state.skipped.toLocaleString("en")} events not shown (the stream carries at most 500 a second)`);
  });
  source.onopen = () => text($("event-status"), "live");
  source.onerror = () => text($("event-status"), "reconnecting…");
}

let busy = false;
async function refresh() {
  if (busy) return;
  busy = true;
  try {
    const tab = state.tab;
    if (tab === "cluster") await refreshCluster();
    else if (tab === "queues") await refreshQueues();
    else if (tab === "pending") await refreshPending();
    else if (tab === "policies") await refreshPolicies();
    else if (tab === "experiments") await refreshExperiments();
    else if (tab === "compare") await refreshCompare();
    else drawEvents();
    // The header says what is shown, whichever tab is open.
    if (tab !== "cluster" && tab !== "experiments" && tab !== "compare") {
      const c = await api("/api/v1/cluster");
      text($("source"), `${c.source} · t=${c.atSeconds}s`);
    }
  } catch (e) {
    text($("source"), `cannot reach the scheduler: ${e.message}`);
  } finally {
    busy = false;
  }
}

setupTabs();
// A link may name the view: /#/pending opens the Pending tab (a path-like fragment, so the
// browser has no element to scroll to).
const linkedTab = () => location.hash.replace(/^#\/?/, "");
function followLink() {
  const tab = linkedTab();
  if (document.querySelector(`[role="tab"][aria-controls="${CSS.escape(tab)}"]`)) select(tab);
}
followLink();
window.addEventListener("hashchange", followLink);
$("nodes").addEventListener("scroll", drawRows);
/** Rows of `list` matching `rows` open their detail on click or Enter. */
function opensDetail(list, rows, open) {
  const opened = (e) => {
    const row = e.target.closest(rows);
    if (row && (e.type === "click" || e.key === "Enter")) open(row.dataset.name);
  };
  $(list).addEventListener("click", opened);
  $(list).addEventListener("keydown", opened);
}
opensDetail("queue-rows", ".queue", showQueue);
opensDetail("domain-rows", ".domain", showDomain);
opensDetail("nodes", ".node-row", showNode);
$("model-filter").addEventListener("change", loadNodes);
$("label-filter").addEventListener("change", loadNodes);
$("queue-filter").addEventListener("change", loadNodes);
for (const id of ["event-queue", "event-node", "event-task"]) {
  $(id).addEventListener("input", drawEvents);
  $(id).addEventListener("change", drawEvents);
}
$("event-kind").addEventListener("change", drawEvents);
$("experiment-trace").addEventListener("change", refreshExperiments);
$("compare-curve").addEventListener("change", refreshCompare);
follow();
// The Experiments tab is shown only where a grid runs, and opened first there (no link naming
// another).
refreshExperiments().then(() => {
  if (!$("tab-experiments").hidden && !linkedTab()) select("experiments");
}).catch(() => {});
// The same for a comparison.
refreshCompare().then(() => {
  if (!$("tab-compare").hidden && !linkedTab()) select("compare");
}).catch(() => {});
refresh();
setInterval(refresh, 2000);
