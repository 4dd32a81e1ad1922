// The dashboard's pages: everything shown comes from /api/v1 and /api/v1/events.

const $ = (id) => document.getElementById(id);
const ROW = 24; // px per node row: only the rows in view are drawn
const state = { nodes: [], tab: "cluster", events: [] };

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

function drawHistory(series) {
  const svg = $("history");
  const line = (key, cls) => {
    const pts = series.filter((p) => p[key] != null);
    if (pts.length < 2) return "";
    const x0 = pts[0].at, x1 = pts[pts.length - 1].at || 1;
    const coords = pts.map((p) => `${((p.at - x0) / (x1 - x0 || 1)) * 600},${120 - p[key] * 1.2}`);
    return `<polyline class="${cls}" points="${coords.join(" ")}"/>`;
  };
  svg.innerHTML = line("allocation_percent", "alloc") + line("fragmentation_percent", "frag");
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

function drawRows() {
  const box = $("nodes"), inner = $("nodes-inner");
  const first = Math.floor(box.scrollTop / ROW), count = Math.ceil(box.clientHeight / ROW) + 2;
  const rows = state.nodes.slice(first, first + count).map((n, i) =>
    `<div class="node-row" role="button" tabindex="0" data-name="${esc(n.name)}" data-row="${first + i}">` +
    `<span class="name">${esc(n.name)}</span><span class="model">${esc(n.model || "no GPU")}</span>` +
    `<span class="gpus">${n.gpus.map(gpuCell).join("")}${n.devices.map(deviceCell).join("")}</span></div>`);
  const html = rows.join("");
  // Unchanged rows are left alone: focus, hover and a click in progress stay where they are.
  if (inner.dataset.drawn !== html) {
    inner.innerHTML = html;
    inner.dataset.drawn = html;
    // Placed through the CSSOM: the page's CSP allows no inline style attributes.
    for (const row of inner.children) row.style.top = `${row.dataset.row * ROW}px`;
  }
}

async function showNode(name) {
  const n = await api(`/api/v1/nodes/${encodeURIComponent(name)}`);
  const d = $("node-detail");
  d.hidden = false;
  d.innerHTML = `<h2>${esc(n.name)}</h2><p>${esc(n.model || "no GPU")} · CPU ${n.cpu_used_milli / 1000}/${n.cpu_milli / 1000}` +
    `${n.unschedulable ? " · cordoned" : ""}</p><ul class="gpu-list">` +
    n.gpus.map((g) => `<li>${gpuCell(g)} GPU ${g.index}: ${g.used_milli / 10}% used` +
      `${g.numa_node != null ? `, NUMA ${g.numa_node}` : ""}${g.memory_bytes ? `, ${(g.memory_bytes / 2 ** 30).toFixed(0)} GiB` : ""}</li>`).join("") +
    `</ul>${n.devices.length ? `<h3>DRA devices (${n.devices.length})</h3><ul class="device-list">` +
      n.devices.map((v) => `<li>${deviceCell(v)} <code>${esc(v.id)}</code> ${esc([v.kind, v.profile, v.model].filter(Boolean).join(" · "))}: ` +
        `${v.held_by.length ? `held by ${esc(v.held_by.join(", "))}` : "free"}</li>`).join("") + "</ul>" : ""}` +
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
  const sel = $("model-filter");
  for (const m of c.cluster.models) {
    if (![...sel.options].some((o) => o.value === m.model)) sel.add(new Option(`${m.model || "unknown"} (${m.gpus})`, m.model));
  }
  drawHistory(c.series);
  fillQueueFilter((await api("/api/v1/queues")).queues);
  await loadNodes();
}

/** A queue's share over time: GPUs allocated and deserved, on one scale. */
async function showQueue(name) {
  const { queue, history } = await api(`/api/v1/queues/${encodeURIComponent(name)}`);
  $("queue-detail").hidden = false;
  text($("queue-name"), queue.name);
  const top = Math.max(1, ...history.map((p) => Math.max(p.allocated_gpu_milli, p.deserved_gpu_milli ?? 0)));
  const x0 = history.length ? history[0].at : 0, x1 = history.length ? history[history.length - 1].at : 0;
  const line = (key, cls) => {
    const pts = history.filter((p) => p[key] != null);
    if (pts.length === 0) return "";
    const coords = pts.map((p) => `${((p.at - x0) / (x1 - x0 || 1)) * 600},${118 - (p[key] / top) * 116}`);
    // One sample: a short flat line, so it shows.
    if (coords.length === 1) coords.push(`600,${coords[0].split(",")[1]}`);
    return `<polyline class="${cls}" points="${coords.join(" ")}"/>`;
  };
  $("queue-history").innerHTML = line("allocated_gpu_milli", "alloc") + line("deserved_gpu_milli", "deserved");
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
function quota(guarantee, cap, f) {
  return (guarantee ? ` · guaranteed ${f(guarantee)}` : "") + (cap != null ? ` · cap ${f(cap)}` : "");
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
  $("queue-rows").innerHTML = rows.map((q) => `<tr class="queue" role="button" tabindex="0" data-name="${esc(q.name)}"><td>${esc(q.name)}</td><td>${esc(q.parent)}</td>` +
    `<td class="served">${q.served ?? ""}</td><td>${q.weight}</td><td>${gpus(q.allocated_gpu_milli)}</td>` +
    `<td>${opt(q.deserved_gpu_milli, gpus)}</td><td>${gpus(q.guarantee_gpu_milli)}</td><td class="borrowed">${gpus(q.borrowed_gpu_milli)}</td>` +
    `<td>${opt(q.capability_gpu_milli, gpus)}</td>` +
    `<td class="cpu">${cores(q.allocated_cpu_milli)} / ${opt(q.deserved_cpu_milli, cores)}${quota(q.guarantee_cpu_milli, q.capability_cpu_milli, cores)}</td>` +
    `<td class="memory">${gib(q.allocated_memory_bytes)} / ${opt(q.deserved_memory_bytes, gib)}${quota(q.guarantee_memory_bytes, q.capability_memory_bytes, gib)}</td>` +
    `<td>${q.pending}</td><td>${q.running}</td></tr>`).join("");
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
  const curves = x.policies.map((p) => (row(trace, p)?.allocation ?? []).map((v, arrived) => [arrived, v]).filter(([a, v]) => v != null && a >= FROM && a <= TO));
  const values = curves.flat().map(([, v]) => v);
  const lo = values.length ? Math.floor(Math.min(...values)) : 0, hi = values.length ? Math.ceil(Math.max(...values)) : 100;
  const span = Math.max(hi - lo, 1);
  $("experiment-chart").innerHTML = curves.map((pts, i) => pts.length < 2 ? "" :
    `<polyline class="policy" data-policy="${esc(x.policies[i])}" stroke="${PALETTE[i % PALETTE.length]}" points="${pts.map(([a, v]) => `${((a - FROM) / (TO - FROM)) * 600},${200 - ((v - lo) / span) * 200}`).join(" ")}"/>`).join("");
  text($("experiment-axes"), `GPU allocated (%, ${lo}–${hi}) by capacity arrived (%, ${FROM}–${TO}):`);
  $("experiment-legend").innerHTML = x.policies.map((p, i) => `<span class="key" data-color="${i % PALETTE.length}"></span> ${esc(p)}`).join(" ");
  // Coloured through the CSSOM: the page's CSP allows no inline style attributes.
  for (const key of $("experiment-legend").querySelectorAll(".key")) key.style.background = PALETTE[key.dataset.color];
  const c = await api("/api/v1/cluster");
  text($("source"), c.source);
}

function drawEvents() {
  const f = $("event-filter").value.trim();
  const shown = f ? state.events.filter((e) => e.includes(f)) : state.events;
  $("event-list").innerHTML = shown.slice(0, 200).map((e) => `<li><code>${esc(e)}</code></li>`).join("");
}

function follow() {
  const source = new EventSource("/api/v1/events");
  source.addEventListener("decision", (e) => {
    state.events.unshift(e.data);
    state.events.length = Math.min(state.events.length, 1000);
    if (state.tab === "decisions") drawEvents();
  });
  source.addEventListener("lagged", (e) => text($("event-status"), `${e.data} events missed (this page fell behind)`));
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
    else drawEvents();
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
opensDetail("nodes", ".node-row", showNode);
$("model-filter").addEventListener("change", loadNodes);
$("label-filter").addEventListener("change", loadNodes);
$("queue-filter").addEventListener("change", loadNodes);
$("event-filter").addEventListener("input", drawEvents);
$("experiment-trace").addEventListener("change", refreshExperiments);
follow();
// The Experiments tab is shown only where a grid runs, and opened first there (no link naming
// another).
refreshExperiments().then(() => {
  if (!$("tab-experiments").hidden && !linkedTab()) select("experiments");
}).catch(() => {});
refresh();
setInterval(refresh, 2000);
