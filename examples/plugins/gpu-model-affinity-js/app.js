// gpu-model-affinity in JavaScript: the Rust example (`../gpu-model-affinity`), decision for
// decision. Scores a node by how early its best free GPU model appears in a preference list.
// Configuration: a comma-separated list, most preferred first, e.g. `H100,A100`.

import { MAX_SCORE, Policy, exportPolicy, fitsDevice } from "./wasmsched_policy.js";
export * from "./wasmsched_policy.js"; // the contract's exports

export class GpuModelAffinity extends Policy {
  static policyName = "gpu-model-affinity";

  constructor(config) {
    super("");
    const preferred = config.split(",").map((m) => m.trim()).filter((m) => m !== "");
    if (preferred.length === 0) throw new Error('name at least one GPU model, e.g. "H100,A100"');
    // Model → its place in the list (the first mention counts, as in the Rust version).
    this.rank = new Map();
    preferred.forEach((model, position) => {
      if (!this.rank.has(model)) this.rank.set(model, position);
    });
    this.count = preferred.length;
  }

  score(task, node) {
    let best = -1;
    for (const gpu of node.gpus) {
      const rank = this.rank.get(gpu.model);
      if (rank !== undefined && (best < 0 || rank < best) && fitsDevice(task.gpu, gpu)) best = rank;
    }
    if (best < 0) return 0;
    // First choice 100, then evenly down to a floor above 0 for the last listed model.
    return MAX_SCORE - Math.floor((best * MAX_SCORE) / (this.count + 1));
  }
}

exportPolicy(GpuModelAffinity);
