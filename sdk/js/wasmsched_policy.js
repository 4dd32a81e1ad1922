// wasmsched policies in JavaScript.
//
// A policy is one class: its name, a constructor that takes the configuration text, and the stage
// methods it implements, each about one task and one node. This module keeps the guest-side copy
// of the nodes the host sends (the mirror), answers the host's batch calls (filter and score over
// many candidate slots, the placement calls that carry usage changes) and turns a throw into a
// plugin fault that says where it was thrown.
//
//   import { Policy, exportPolicy, MAX_SCORE } from "./wasmsched_policy.js";
//   export * from "./wasmsched_policy.js"; // the contract's exports
//
//   class PreferH100 extends Policy {
//     static policyName = "prefer-h100";
//     score(task, node) { return node.gpus.some((g) => g.model === "H100") ? MAX_SCORE : 0; }
//   }
//   exportPolicy(PreferH100);
//
// Records are as componentize-js passes them: fields in camelCase, enums as kebab-case strings,
// options as the value or `undefined`, and 64-bit integers (CPU milli-cores, memory and GPU
// milli-GPUs in `Resources`, memory on devices) as BigInt — compare them with BigInt literals
// (`10n`). Stage methods, all optional (the stages declared to the host are the ones defined):
//
// - filter(task, node): undefined/true when it fits; a string, false or unfit(reason) when it
//   does not (preemption may help); unresolvable(reason) when nothing can help.
// - score(task, node): an integer, clamped to 0..100.
// - selectVictims(preemptor, candidates, nodes): null, or [candidate index, [victim indices]].
// - fairShare(queues, cluster): [deserved, order].
// - selectDevices(task, node): [[gpu index, milli], ...], or a string saying why not.
//
// The records' TypeScript declarations, generated from wit/policy.wit: sdk/js/types (types.mjs).

export const SDK_VERSION = "wasmsched-js/0.1.0";
export const MAX_SCORE = 100;
export const GPU_MILLI = 1000;

const STAGES = [
  ["filter", "filter"],
  ["score", "score"],
  ["selectVictims", "preempt"],
  ["fairShare", "fair-share"],
  ["selectDevices", "select-devices"],
];

/** Base class of a policy: set `static policyName` and define the stage methods you implement. */
export class Policy {
  static policyName = "js-policy";

  constructor(config) {
    if (config.trim() !== "") {
      throw new Error(`${this.constructor.policyName} takes no configuration, got ${JSON.stringify(config)}`);
    }
  }
}

class Verdict {
  constructor(reason, unresolvable) {
    this.reason = reason;
    this.unresolvable = unresolvable;
  }
}

/** The node does not fit now; preemption may help. */
export function unfit(reason) {
  return new Verdict(reason, false);
}

/** The node cannot fit whatever is evicted (preemption skips it). */
export function unresolvable(reason) {
  return new Verdict(reason, true);
}

/** Whether one device can serve one GPU of `request` now (share, memory, model, health). */
export function fitsDevice(request, gpu) {
  if (gpu.health === "unhealthy") return false;
  if (request.models.length > 0 && !request.models.includes(gpu.model)) return false;
  return gpu.freeMilli >= request.milliPerGpu && gpu.freeMemoryBytes >= request.memoryBytesPerGpu;
}

let factory = null;
let policy = null;
let nodes = [];

/** Makes `cls` the policy this component serves. */
export function exportPolicy(cls) {
  factory = cls;
}

class Fault extends Error {}

// `Type: message (file.js line N)`, at the innermost frame of the policy's own code.
function described(e) {
  if (!(e instanceof Error)) return `thrown: ${String(e)}`;
  const frames = String(e.stack || "")
    .split("\n")
    .filter((l) => l.includes(":") && !l.includes("wasmsched_policy.js"));
  const match = frames.length > 0 ? /([^/@\s]+\.js):(\d+)/.exec(frames[0]) : null;
  const where = match ? ` (${match[1]} line ${match[2]})` : "";
  return `${e.name}: ${e.message}${where}`;
}

function guarded(stage, call) {
  try {
    return call();
  } catch (e) {
    if (e instanceof Fault) throw e.message;
    throw `${stage}: ${described(e)}`;
  }
}

function current() {
  if (policy === null) throw new Fault("the policy was not initialised");
  return policy;
}

function mirrored(slot) {
  const n = nodes[slot];
  if (n === undefined || n === null) throw new Fault(`slot ${slot} is not in the mirror`);
  return n;
}

function applyUsage(usage) {
  for (const [slot, u] of usage) {
    const n = nodes[slot];
    if (n === undefined || n === null || n.gpus.length !== u.gpus.length) {
      throw new Fault(`usage for slot ${slot} does not match the mirror`);
    }
  }
  for (const [slot, u] of usage) {
    const n = nodes[slot];
    n.allocated = u.allocated;
    u.gpus.forEach((g, i) => {
      n.gpus[i].freeMilli = g.freeMilli;
      n.gpus[i].freeMemoryBytes = g.freeMemoryBytes;
    });
  }
}

function fullTask(stageTask) {
  if (stageTask.tag === "full") return stageTask.val;
  const b = stageTask.val;
  return {
    id: b.id,
    namespace: b.namespace,
    group: b.group,
    queue: b.queue,
    priority: b.priority,
    qos: b.qos,
    request: { cpuMilli: b.cpuMilli, memoryBytes: b.memoryBytes, gpuMilli: b.gpuMilli, extended: [] },
    gpu: { count: b.gpuCount, milliPerGpu: b.milliPerGpu, memoryBytesPerGpu: b.memoryBytesPerGpu, models: [] },
    nodeSelector: [],
    nodeAffinity: { required: [], preferred: [] },
    tolerations: [],
  };
}

function filterBatch(task, candidates, enough) {
  const p = current();
  const codes = [];
  const reasons = [];
  const index = new Map();
  let fits = 0;
  for (const slot of candidates) {
    let verdict = p.filter(task, mirrored(slot));
    if (verdict === undefined || verdict === null || verdict === true) {
      codes.push(0);
      fits += 1;
      if (enough !== undefined && fits >= enough) break;
      continue;
    }
    if (verdict === false) verdict = unfit("does not fit");
    else if (typeof verdict === "string") verdict = unfit(verdict);
    const key = `${verdict.unresolvable}\u0000${verdict.reason}`;
    if (!index.has(key)) {
      reasons.push({ reason: verdict.reason, unresolvable: verdict.unresolvable });
      index.set(key, reasons.length);
    }
    codes.push(index.get(key));
  }
  return { codes, reasons };
}

function scoreBatch(task, candidates) {
  const p = current();
  return candidates.map((slot) => {
    const s = Math.trunc(Number(p.score(task, mirrored(slot))));
    return Number.isFinite(s) ? Math.max(0, Math.min(MAX_SCORE, s)) : 0;
  });
}

export const plugin = {
  init(config) {
    if (factory === null) throw "no policy exported: call exportPolicy(YourPolicy) in the app module";
    guarded("init", () => {
      policy = new factory(config);
    });
    const stages = STAGES.filter(([method]) => typeof policy[method] === "function").map(([, stage]) => stage);
    const name = factory.policyName;
    if (stages.length === 0) throw `${name} defines no stage method (filter, score, selectVictims, fairShare, selectDevices)`;
    return { name, stages, sdkVersion: SDK_VERSION };
  },
};

export const mirror = {
  reset(generation, slots) {
    nodes = new Array(slots).fill(null);
  },
  upsert(generation, upserted) {
    for (const [slot, n] of upserted) nodes[slot] = n;
  },
  remove(generation, slots) {
    for (const slot of slots) nodes[slot] = null;
  },
};

export const mirrorUsage = {
  updateUsage(generation, usage) {
    guarded("update-usage", () => applyUsage(usage));
  },
};

export const filter = {
  filter(task, candidates) {
    return guarded("filter", () => filterBatch(task, candidates, undefined));
  },
};

export const score = {
  score(task, candidates) {
    return guarded("score", () => scoreBatch(task, candidates));
  },
};

function placementStage(stage, usage, run) {
  try {
    applyUsage(usage);
  } catch (e) {
    throw { tag: "out-of-step", val: e instanceof Error ? e.message : String(e) };
  }
  try {
    return guarded(stage, run);
  } catch (e) {
    throw { tag: "failed", val: String(e) };
  }
}

export const placement = {
  filter(generation, usage, task, candidates, enough) {
    return placementStage("filter", usage, () => filterBatch(fullTask(task), candidates, enough));
  },
  score(generation, usage, task, candidates) {
    return placementStage("score", usage, () => scoreBatch(fullTask(task), candidates));
  },
};

export const selectDevices = {
  selectDevices(task, slot) {
    return guarded("select-devices", () => {
      const answer = current().selectDevices(task, mirrored(slot));
      if (typeof answer === "string") return { tag: "err", val: { reason: answer, unresolvable: false } };
      if (answer instanceof Verdict) return { tag: "err", val: { reason: answer.reason, unresolvable: answer.unresolvable } };
      return { tag: "ok", val: answer.map(([gpu, milli]) => ({ gpu, milli })) };
    });
  },
};

export const selectClaimDevices = {
  rank(task, slot, request) {
    throw "select-claim-devices is not implemented by JavaScript policies";
  },
};

export const preempt = {
  selectVictims(preemptor, candidates) {
    return guarded("preempt", () => {
      const answer = current().selectVictims(preemptor, candidates, candidates.map((c) => mirrored(c.node)));
      if (answer === null || answer === undefined) return undefined;
      const [candidate, victims] = answer;
      return { candidate, victims };
    });
  },
};

function share(queues, cluster) {
  const [deserved, order] = current().fairShare(queues, cluster);
  if (deserved.length !== queues.length) {
    throw new Fault(`fairShare returned ${deserved.length} deserved shares for ${queues.length} queues`);
  }
  return [deserved, order];
}

export const fairShare = {
  compute(queues, cluster) {
    return guarded("fair-share", () => {
      const [deserved, order] = share(queues, cluster);
      return { deserved, order };
    });
  },
};

let queues = [];

export const fairShareDelta = {
  computeChanged(reset, count, changed, cluster) {
    return guarded("fair-share", () => {
      if (reset) queues = new Array(count).fill(null);
      queues.length = count;
      for (const [i, q] of changed) queues[i] = q;
      if (queues.some((q) => q === null || q === undefined)) throw new Fault("fair-share-delta: a queue was never sent");
      const [deserved, order] = share(queues, cluster);
      return { deserved: deserved.map((d, i) => [i, d]), order };
    });
  },
};

// ---- building records, for tests ------------------------------------------------------------------

/** A `resources` record (64-bit fields as BigInt, as the component receives them). */
export function resources({ cpuMilli = 0n, memoryBytes = 0n, gpuMilli = 0n, extended = [] } = {}) {
  return { cpuMilli: BigInt(cpuMilli), memoryBytes: BigInt(memoryBytes), gpuMilli: BigInt(gpuMilli), extended };
}

/** A `gpu-device` record: entirely free unless told otherwise. */
export function gpu(index = 0, { model = "", memoryBytes = 80n << 30n, freeMilli = GPU_MILLI, health = "healthy" } = {}) {
  return { index, model, memoryBytes, freeMilli, freeMemoryBytes: memoryBytes, health, numaNode: undefined };
}

/** A `node` record; its allocatable GPUs are what its devices add up to. */
export function node(name = "node", gpus = []) {
  return {
    name,
    labels: [],
    taints: [],
    allocatable: resources({ gpuMilli: BigInt(GPU_MILLI * gpus.length) }),
    allocated: resources(),
    gpus,
    unschedulable: false,
  };
}

/** A `task` record asking for `gpus` devices (each `milliPerGpu` of one). */
export function task({ id = "task", gpus = 0, milliPerGpu = GPU_MILLI, models = [], queue = "default", priority = 0 } = {}) {
  return {
    id,
    namespace: "default",
    group: undefined,
    queue,
    priority,
    qos: "burstable",
    request: resources({ gpuMilli: BigInt(gpus * milliPerGpu) }),
    gpu: { count: gpus, milliPerGpu, memoryBytesPerGpu: 0n, models },
    nodeSelector: [],
    nodeAffinity: { required: [], preferred: [] },
    tolerations: [],
  };
}

/** Runs a policy natively through the same batch code the component runs (init, the mirror, the
 * stage calls, throws as errors), for `node --test` without a component. */
export class Harness {
  constructor(cls, config = "") {
    exportPolicy(cls);
    this.info = plugin.init(config);
  }

  #mirror(list) {
    mirror.reset(1n, list.length);
    mirror.upsert(1n, list.map((n, i) => [i, n]));
    return list.map((_, i) => i);
  }

  /** One score per node. */
  score(t, list) {
    return score.score(t, this.#mirror(list));
  }

  /** Per node: null when it fits, else the reason. */
  filter(t, list) {
    const result = filter.filter(t, this.#mirror(list));
    return result.codes.map((code) => (code === 0 ? null : result.reasons[code - 1].reason));
  }
}
