// gpu-model-filter in JavaScript: the Rust example (`../gpu-model-filter`), verdict for verdict.
// A task that asks for GPUs fits only a node with enough free GPUs of the listed models; a node
// without any GPU of those models is unresolvable, one with too few free is unfit.
// Configuration: a comma-separated list of models, e.g. `H100,A100`.

import { Policy, exportPolicy, fitsDevice, unfit, unresolvable } from "./wasmsched_policy.js";
export * from "./wasmsched_policy.js"; // the contract's exports

export class GpuModelFilter extends Policy {
  static policyName = "gpu-model-filter";

  constructor(config) {
    super("");
    this.models = config.split(",").map((m) => m.trim()).filter((m) => m !== "");
    if (this.models.length === 0) throw new Error('name at least one GPU model, e.g. "H100,A100"');
    const listed = this.models.join(", ");
    // The verdicts, made once: a filter answers for every node of every cycle.
    this.none = unresolvable(`no GPU of ${listed}`);
    this.tooFew = unfit(`too few free GPUs of ${listed}`);
  }

  filter(task, node) {
    const want = task.gpu.count;
    if (want === 0) return undefined;
    let listed = 0;
    let free = 0;
    for (const gpu of node.gpus) {
      if (!this.models.includes(gpu.model)) continue;
      listed += 1;
      if (fitsDevice(task.gpu, gpu)) free += 1;
    }
    if (listed === 0) return this.none;
    return free >= want ? undefined : this.tooFew;
  }
}

exportPolicy(GpuModelFilter);
