// {{NAME}}: a score policy. It prefers nodes whose GPUs are entirely free (spreading work);
// replace `score` with your own, or add `filter`, `selectVictims`, `fairShare`, `selectDevices`
// (the comment at the top of wasmsched_policy.js says what each returns).

import { GPU_MILLI, MAX_SCORE, Policy, exportPolicy } from "./wasmsched_policy.js";
export * from "./wasmsched_policy.js"; // the contract's exports

export class ThePolicy extends Policy {
  static policyName = "{{NAME}}";

  score(task, node) {
    if (node.gpus.length === 0) return 0;
    const idle = node.gpus.filter((g) => g.freeMilli === GPU_MILLI).length;
    return Math.floor((idle * MAX_SCORE) / node.gpus.length);
  }
}

exportPolicy(ThePolicy);
