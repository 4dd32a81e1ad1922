// priority-preempt in JavaScript: the built-in preempt policy (`plugins/priority-preempt`), decision
// for decision — see `../priority-preempt-py/app.py` for the rules in words. Configuration (JSON,
// all optional): {"min_priority_diff": 1, "min_runtime_seconds": 0, "max_victims": 0}.
//
// 64-bit quantities (CPU, memory, running seconds) arrive as BigInt; the arithmetic on them stays
// in BigInt so that nothing is rounded.

import { GPU_MILLI, Policy, exportPolicy } from "./wasmsched_policy.js";
export * from "./wasmsched_policy.js"; // the contract's exports

const KNOWN = new Set(["min_priority_diff", "min_runtime_seconds", "max_victims"]);
const GPU = BigInt(GPU_MILLI);

const surplus = (v) => v.groupRunning > v.groupMinMember;

/** A non-surplus member of a group: evicting it takes the whole running group down. */
const breaksGroup = (v) => v.task.group !== undefined && !surplus(v);

/** The work a victim loses: its own, or (when it breaks its gang) the whole running gang's. */
function lostGpuSeconds(v) {
  if (v.checkpointable) return 0n;
  const own = (v.runningSeconds * BigInt(v.task.gpu.count) * BigInt(v.task.gpu.milliPerGpu)) / GPU;
  return breaksGroup(v) ? own * BigInt(Math.max(v.groupRunning, 1)) : own;
}

function extended(resources, name) {
  const found = resources.extended.find(([key]) => key === name);
  return found ? found[1] : 0n;
}

const saturating = (a, b) => (a > b ? a - b : 0n);

/** Estimate (from node totals) whether `task` fits `node` once `victims` are gone. */
function fitsAfter(task, node, victims) {
  const freed = (f) => victims.reduce((sum, v) => sum + f(v.task), 0n);
  const freeCpu = saturating(node.allocatable.cpuMilli, node.allocated.cpuMilli);
  const freeMemory = saturating(node.allocatable.memoryBytes, node.allocated.memoryBytes);
  if (freeCpu + freed((t) => t.request.cpuMilli) < task.request.cpuMilli) return false;
  if (freeMemory + freed((t) => t.request.memoryBytes) < task.request.memoryBytes) return false;
  for (const [name, want] of task.request.extended) {
    const free = saturating(extended(node.allocatable, name), extended(node.allocated, name));
    if (free + freed((t) => extended(t.request, name)) < want) return false;
  }
  const req = task.gpu;
  if (req.count === 0) return true;
  const usable = node.gpus.filter(
    (g) => g.health !== "unhealthy" && (req.models.length === 0 || req.models.includes(g.model)),
  );
  if (req.milliPerGpu >= GPU_MILLI) {
    const idle = BigInt(usable.filter((g) => g.freeMilli >= GPU_MILLI).length);
    const wholeFreed = freed((t) => (t.gpu.milliPerGpu >= GPU_MILLI ? BigInt(t.gpu.count) : 0n));
    return idle + wholeFreed >= BigInt(req.count);
  }
  const sharedFreed = freed((t) => BigInt(t.gpu.count) * BigInt(t.gpu.milliPerGpu));
  return usable.some((g) => BigInt(g.freeMilli) + sharedFreed >= BigInt(req.milliPerGpu));
}

/** Lexicographic comparison of two cost tuples (numbers and BigInts). */
function less(a, b) {
  for (let i = 0; i < a.length; i++) {
    if (a[i] < b[i]) return true;
    if (a[i] > b[i]) return false;
  }
  return false;
}

export class PriorityPreempt extends Policy {
  static policyName = "priority-preempt";

  constructor(config) {
    super("");
    const settings = config.trim() === "" ? {} : JSON.parse(config);
    const unknown = Object.keys(settings).filter((k) => !KNOWN.has(k));
    if (unknown.length > 0) throw new Error(`invalid priority-preempt configuration: unknown field "${unknown.sort()[0]}"`);
    this.minPriorityDiff = settings.min_priority_diff ?? 1;
    this.minRuntimeSeconds = BigInt(settings.min_runtime_seconds ?? 0);
    this.maxVictims = settings.max_victims ?? 0;
    if (this.minPriorityDiff < 1) {
      throw new Error(
        "invalid priority-preempt configuration: min_priority_diff must be at least 1 (equal priorities never preempt each other)",
      );
    }
  }

  eligible(preemptor, v) {
    if (v.runningSeconds < this.minRuntimeSeconds) return false;
    if (v.task.queue === preemptor.queue && !surplus(v)) return preemptor.priority - v.task.priority >= this.minPriorityDiff;
    return true;
  }

  /** The cheapest victims on one node, by index, with their cost; null when not enough. */
  planNode(preemptor, c, node) {
    const victims = c.victims;
    const key = (i) => [surplus(victims[i]) ? 0 : 1, victims[i].task.priority, lostGpuSeconds(victims[i]), i];
    const order = victims.map((_, i) => i).filter((i) => this.eligible(preemptor, victims[i]));
    order.sort((a, b) => (less(key(a), key(b)) ? -1 : less(key(b), key(a)) ? 1 : 0));
    const refs = (indices) => indices.map((i) => victims[i]);
    let chosen = [];
    if (!fitsAfter(preemptor, node, [])) {
      for (const i of order) {
        chosen.push(i);
        if (fitsAfter(preemptor, node, refs(chosen))) break;
      }
      if (!fitsAfter(preemptor, node, refs(chosen))) return null;
      // Drop victims that turned out unnecessary, most expensive first.
      for (let position = chosen.length - 1; position >= 0; position--) {
        const without = chosen.filter((_, k) => k !== position);
        if (fitsAfter(preemptor, node, refs(without))) chosen = without;
      }
    }
    // The estimate says it fits already; the host found otherwise: offer nothing here.
    if (chosen.length === 0) return null;
    if (this.maxVictims > 0 && chosen.length > this.maxVictims) return null;
    return [chosen, this.cost(c, chosen)];
  }

  cost(c, chosen) {
    const victims = chosen.map((i) => c.victims[i]);
    let total = 0;
    let lost = 0n;
    const groups = new Set();
    for (const v of victims) {
      if (breaksGroup(v)) {
        const key = `${v.task.namespace}\u0000${v.task.group}`;
        if (!groups.has(key)) {
          groups.add(key);
          total += Math.max(v.groupRunning, 1);
          lost += lostGpuSeconds(v);
        }
      } else {
        total += 1;
        lost += lostGpuSeconds(v);
      }
    }
    return [
      victims.some((v) => !surplus(v)) ? 1 : 0,
      Math.max(...victims.map((v) => v.task.priority)),
      lost,
      total,
    ];
  }

  selectVictims(preemptor, candidates, nodes) {
    let best = null;
    candidates.forEach((c, index) => {
      const plan = this.planNode(preemptor, c, nodes[index]);
      if (plan !== null && (best === null || less(plan[1], best[0]))) best = [plan[1], index, plan[0]];
    });
    return best === null ? null : [best[1], best[2]];
  }
}

exportPolicy(PriorityPreempt);
