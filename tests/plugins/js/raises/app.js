// A JavaScript policy that fails the way authors' code does, by configuration.
import { Policy, exportPolicy, unfit } from "./wasmsched_policy.js";
export * from "./wasmsched_policy.js";

class Raises extends Policy {
  static policyName = "raises";

  constructor(config) {
    super("");
    if (config === "bad-config") throw new RangeError("unknown mode 'bad-config'");
    this.mode = config;
  }

  score(task, node) {
    if (this.mode === "type") return node.missing.field;
    return 50;
  }

  filter(task, node) {
    if (this.mode === "loop") for (;;) {}
    return node.name.endsWith("0") ? undefined : unfit("not a node ending in 0");
  }
}

exportPolicy(Raises);
