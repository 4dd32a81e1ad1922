// fair-share in JavaScript: the built-in fair-share policy (`plugins/fair-share`), decision for
// decision — see `../fair-share-py/app.py` for the rules in words. Configuration (JSON, optional):
// {"policy": "proportion" | "drf" | "decayed-usage"}, default proportion.
//
// Amounts arrive as BigInt and the water-filling stays in BigInt, so nothing is rounded; the keys
// that order queues are doubles, as in the Rust version.

import { Policy, exportPolicy, resources } from "./wasmsched_policy.js";
export * from "./wasmsched_policy.js"; // the contract's exports

const POLICIES = ["proportion", "drf", "decayed-usage"];
const U64_MAX = (1n << 64n) - 1n;
const RESOLUTION = 1e9;

const min = (a, b) => (a < b ? a : b);
const max = (a, b) => (a > b ? a : b);

/** `(x * 1e9).round()` as Rust rounds (halves away from zero; keys are never negative), as a BigInt. */
function quantised(x) {
  const v = x * RESOLUTION;
  // Infinite keys (something allocated against a deserved share of 0) tie with each other, last.
  if (v === Infinity) return 1n << 127n;
  const whole = Math.floor(v);
  return BigInt(v - whole >= 0.5 ? whole + 1 : whole);
}

function ratio(a, b) {
  if (a === 0n) return 0;
  if (b === 0n) return Infinity;
  return Number(a) / Number(b);
}

function maxRatio(a, b) {
  let best = 0;
  for (let i = 0; i < a.length; i++) best = Math.max(best, ratio(a[i], b[i]));
  return best;
}

/** `r` as one amount per dimension; `absent` for an extended resource it does not name. */
function row(r, names, absent) {
  if (r === undefined || r === null) return new Array(3 + names.length).fill(absent);
  const extended = new Map(r.extended);
  return [r.cpuMilli, r.memoryBytes, r.gpuMilli, ...names.map((n) => (extended.has(n) ? extended.get(n) : absent))];
}

/** Names compared by code point, as Rust and Python compare them (not by UTF-16 unit). */
function byName(a, b) {
  const x = [...a];
  const y = [...b];
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = x[i].codePointAt(0) - y[i].codePointAt(0);
    if (d !== 0) return d;
  }
  return x.length - y.length;
}

const cmpBig = (a, b) => (a < b ? -1 : a > b ? 1 : 0);

class Tree {
  constructor(queues) {
    const n = queues.length;
    this.children = queues.map(() => []);
    this.roots = [];
    queues.forEach((q, i) => {
      if (q.weight === 0) throw new Error(`queue ${q.name}: weight must be positive`);
      const p = q.parent;
      if (p === undefined || p === null) this.roots.push(i);
      else if (p < n && p !== i) this.children[p].push(i);
      else throw new Error(`queue ${q.name}: parent index ${p} is not another queue`);
    });
    for (const q of queues) {
      let at = q;
      for (let step = 0; step <= n && at.parent !== undefined && at.parent !== null; step++) at = queues[at.parent];
      if (at.parent !== undefined && at.parent !== null) throw new Error(`queue ${q.name}: its ancestry has a cycle`);
    }
  }

  leaves(q, out) {
    if (this.children[q].length === 0) out.push(q);
    for (const c of this.children[q]) this.leaves(c, out);
  }
}

/** Every queue's deserved amount of dimension `d`, from the cluster's `total` down. */
function waterFill(tree, d, total, request, capability, guarantee, weight) {
  const n = weight.length;
  const demand = new Array(n).fill(0n);
  const computeDemand = (q) => {
    let own = request[q][d];
    if (tree.children[q].length > 0) {
      let children = 0n;
      for (const c of tree.children[q]) children = min(children + computeDemand(c), U64_MAX);
      own = max(own, children);
    }
    demand[q] = min(own, capability[q][d]);
    return demand[q];
  };
  for (const r of tree.roots) computeDemand(r);
  const out = new Array(n).fill(0n);
  const split = (children, amount) => {
    if (children.length === 0) return;
    const guaranteed = children.map((c) => min(guarantee[c][d], demand[c]));
    const promised = guaranteed.reduce((s, g) => s + g, 0n);
    children.forEach((c, i) => {
      out[c] = promised > amount ? (guaranteed[i] * amount) / promised : guaranteed[i];
    });
    let remaining = amount - children.reduce((s, c) => s + out[c], 0n);
    let active = children.filter((c) => out[c] < demand[c]);
    while (remaining > 0n && active.length > 0) {
      const weights = active.reduce((s, c) => s + weight[c], 0n);
      let given = 0n;
      for (const c of active) {
        const give = min((remaining * weight[c]) / weights, demand[c] - out[c]);
        out[c] += give;
        given += give;
      }
      if (given === 0n) {
        // Less than one unit per weight is left: the heaviest unmet child takes it (the first of equals).
        const c = active.reduce((best, c) => (weight[c] > weight[best] ? c : best));
        given = min(remaining, demand[c] - out[c]);
        out[c] += given;
      }
      remaining -= given;
      active = active.filter((c) => out[c] < demand[c]);
    }
    for (const c of children) split(tree.children[c], out[c]);
  };
  split(tree.roots, total);
  return out;
}

/** Each queue's share of the whole tree: its weight among its siblings times its parent's. */
function normalizedShares(tree, queues) {
  const share = new Array(queues.length).fill(0);
  const walk = (level, parent) => {
    let total = 0;
    for (const q of level) total += queues[q].weight;
    for (const q of level) {
      share[q] = (parent * queues[q].weight) / total;
      walk(tree.children[q], share[q]);
    }
  };
  walk(tree.roots, 1);
  return share;
}

export class FairSharePolicy extends Policy {
  static policyName = "fair-share";

  constructor(config) {
    super("");
    const settings = config.trim() === "" ? {} : JSON.parse(config);
    const unknown = Object.keys(settings).filter((k) => k !== "policy");
    if (unknown.length > 0) throw new Error(`invalid fair-share configuration: unknown field "${unknown.sort()[0]}"`);
    this.policy = settings.policy ?? "proportion";
    if (!POLICIES.includes(this.policy)) {
      throw new Error(`invalid fair-share configuration: policy must be one of ${POLICIES.join(", ")}`);
    }
  }

  fairShare(queues, cluster) {
    const tree = new Tree(queues);
    const names = cluster.extended.map(([n]) => n);
    const total = row(cluster, names, 0n);
    const request = queues.map((q) => row(q.request, names, 0n));
    const allocated = queues.map((q) => row(q.allocated, names, 0n));
    const capability = queues.map((q) => row(q.capability, names, U64_MAX));
    const guarantee = queues.map((q) => row(q.guarantee, names, 0n));
    const weight = queues.map((q) => BigInt(q.weight));
    const share = queues.map(() => new Array(total.length).fill(0n));
    for (let d = 0; d < total.length; d++) {
      const amounts = waterFill(tree, d, total[d], request, capability, guarantee, weight);
      amounts.forEach((v, q) => {
        share[q][d] = v;
      });
    }
    const order = this.order(tree, queues, total, request, allocated, share);
    const deserved = share.map((s) =>
      resources({ cpuMilli: s[0], memoryBytes: s[1], gpuMilli: s[2], extended: names.map((n, i) => [n, s[3 + i]]) }),
    );
    return [deserved, order];
  }

  order(tree, queues, total, request, allocated, share) {
    const subtree = allocated.map((a) => [...a]);
    const accumulate = (q) => {
      for (const c of tree.children[q]) {
        accumulate(c);
        subtree[q] = subtree[q].map((own, d) => min(own + subtree[c][d], U64_MAX));
      }
    };
    for (const r of tree.roots) accumulate(r);
    const dominant = subtree.map((s) => quantised(maxRatio(s, total)));
    const pending = (q) => request[q].some((r, d) => r > allocated[q][d]);
    const tie = (a, b) => cmpBig(dominant[a], dominant[b]) || byName(queues[a].name, queues[b].name);
    if (this.policy === "drf") {
      const out = [];
      const unweighted = subtree.map((s) => maxRatio(s, total));
      const visit = (level) => {
        const key = new Map(level.map((q) => [q, quantised(unweighted[q] / queues[q].weight)]));
        for (const q of [...level].sort((a, b) => cmpBig(key.get(a), key.get(b)) || tie(a, b))) {
          if (tree.children[q].length === 0) {
            if (pending(q)) out.push(q);
          } else visit(tree.children[q]);
        }
      };
      visit(tree.roots);
      return out;
    }
    const leaves = [];
    for (const r of tree.roots) tree.leaves(r, leaves);
    let key;
    if (this.policy === "proportion") key = queues.map((_, q) => quantised(maxRatio(allocated[q], share[q])));
    else {
      const normal = normalizedShares(tree, queues);
      key = queues.map((q, i) => quantised(Math.max(q.decayedUsage, 0) / normal[i]));
    }
    return leaves.filter(pending).sort((a, b) => cmpBig(key[a], key[b]) || tie(a, b));
  }
}

exportPolicy(FairSharePolicy);
