"""fair-share in Python: the built-in fair-share policy (`plugins/fair-share`), decision for
decision. Deserved shares of a queue tree by hierarchical weighted water-filling, and the order in
which leaf queues with pending work are served.

Deserved shares, per resource dimension (CPU, memory, GPU, then the cluster's extended resources
by name), level by level from the cluster down:

1. each child first gets its guarantee, capped by its demand; guarantees that together exceed the
   parent's amount are scaled down in proportion;
2. the rest is split by weight among the children whose demand is not met, in rounds, each capped
   at its demand; a remainder too small to split by weight goes to the heaviest unmet child.

A queue's demand is its request (a parent's: the sum of its children's, or its own if larger),
capped by its capability (which bounds only the extended resources it names).

Order (configuration `{"policy": "proportion" | "drf" | "decayed-usage"}`, default `proportion`):
leaves by allocated / deserved (the largest over dimensions); `drf`: at each level, children by
weighted dominant share of their subtree against the cluster; `decayed-usage`: leaves by decayed
usage over their share of the tree's weight. Ties: lower unweighted dominant share, then name.
Keys are compared at a resolution of 1e-9, rounded as the Rust version rounds.
"""

import json
import math

import wasmsched_policy as wp
from wasmsched_policy import *  # noqa: F401,F403 - the contract's exports, looked up here

POLICIES = ("proportion", "drf", "decayed-usage")
U64_MAX = (1 << 64) - 1
RESOLUTION = 1e9
# Infinite keys (something allocated against a deserved share of 0) tie with each other, last.
INFINITE = 1 << 127


def quantised(x: float) -> int:
    """`(x * 1e9).round()` as Rust rounds: halves away from zero (keys are never negative)."""
    v = x * RESOLUTION
    if math.isinf(v):
        return INFINITE
    whole = math.floor(v)
    return whole + 1 if v - whole >= 0.5 else whole


def ratio(a: int, b: int) -> float:
    if a == 0:
        return 0.0
    if b == 0:
        return math.inf
    return float(a) / float(b)


def dimensions(cluster):
    """CPU, memory, GPU, then the cluster's extended resources in name order."""
    return ["cpu", "memory", "gpu"] + [name for name, _ in cluster.extended]


def row(resources, names, absent: int):
    """`resources` as one number per dimension; `absent` for an extended one it does not name."""
    if resources is None:
        return [absent] * (3 + len(names))
    extended = dict(resources.extended)
    return [resources.cpu_milli, resources.memory_bytes, resources.gpu_milli] + [
        extended.get(name, absent) for name in names
    ]


class Tree:
    """Children of each queue and the roots, validated: parents in range, no cycles, weights > 0."""

    def __init__(self, queues):
        n = len(queues)
        self.children = [[] for _ in range(n)]
        self.roots = []
        for i, q in enumerate(queues):
            if q.weight == 0:
                raise ValueError(f"queue {q.name}: weight must be positive")
            p = q.parent
            if p is None:
                self.roots.append(i)
            elif p < n and p != i:
                self.children[p].append(i)
            else:
                raise ValueError(f"queue {q.name}: parent index {p} is not another queue")
        for q in queues:
            at = q
            for _ in range(n + 1):
                if at.parent is None:
                    break
                at = queues[at.parent]
            if at.parent is not None:
                raise ValueError(f"queue {q.name}: its ancestry has a cycle")

    def leaves(self, q: int, out: list) -> None:
        if not self.children[q]:
            out.append(q)
        for c in self.children[q]:
            self.leaves(c, out)


class FairSharePolicy(wp.Policy):
    name = "fair-share"

    def __init__(self, config: str):
        settings = json.loads(config) if config.strip() else {}
        unknown = set(settings) - {"policy"}
        if unknown:
            raise ValueError(f"invalid {self.name} configuration: unknown field {sorted(unknown)[0]!r}")
        self.policy = settings.get("policy", "proportion")
        if self.policy not in POLICIES:
            raise ValueError(f"invalid {self.name} configuration: policy must be one of {', '.join(POLICIES)}")

    def fair_share(self, queues, cluster):
        tree = Tree(queues)
        extended = [name for name, _ in cluster.extended]
        total = row(cluster, extended, 0)
        request = [row(q.request, extended, 0) for q in queues]
        allocated = [row(q.allocated, extended, 0) for q in queues]
        capability = [row(q.capability, extended, U64_MAX) for q in queues]
        guarantee = [row(q.guarantee, extended, 0) for q in queues]
        weight = [q.weight for q in queues]

        share = [[0] * len(total) for _ in queues]
        for d in range(len(total)):
            amounts = water_fill(tree, d, total[d], request, capability, guarantee, weight)
            for q, v in enumerate(amounts):
                share[q][d] = v
        order = self.order(tree, queues, total, request, allocated, share)
        deserved = [
            wp.resources(cpu_milli=s[0], memory_bytes=s[1], gpu_milli=s[2], extended=list(zip(extended, s[3:])))
            for s in share
        ]
        return deserved, order

    def order(self, tree, queues, total, request, allocated, share):
        subtree = [list(a) for a in allocated]

        def accumulate(q):
            for c in tree.children[q]:
                accumulate(c)
                subtree[q] = [min(own + child, U64_MAX) for own, child in zip(subtree[q], subtree[c])]

        for r in tree.roots:
            accumulate(r)
        dominant = [max_ratio(s, total) for s in subtree]

        def pending(q):
            return any(r > a for r, a in zip(request[q], allocated[q]))

        def tie(q):
            return (quantised(dominant[q]), queues[q].name)

        out = []
        if self.policy == "drf":

            def visit(level):
                level = sorted(level, key=lambda q: (quantised(dominant[q] / float(queues[q].weight)), tie(q)))
                for q in level:
                    if not tree.children[q]:
                        if pending(q):
                            out.append(q)
                    else:
                        visit(tree.children[q])

            visit(tree.roots)
            return out
        leaves = []
        for r in tree.roots:
            tree.leaves(r, leaves)
        leaves = [q for q in leaves if pending(q)]
        if self.policy == "proportion":
            key = [max_ratio(allocated[q], share[q]) for q in range(len(queues))]
        else:
            normal = normalized_shares(tree, queues)
            key = [max(q.decayed_usage, 0.0) / s for q, s in zip(queues, normal)]
        leaves.sort(key=lambda q: (quantised(key[q]), tie(q)))
        return leaves


def max_ratio(a, b) -> float:
    best = 0.0
    for x, y in zip(a, b):
        best = max(best, ratio(x, y))
    return best


def water_fill(tree, d, total, request, capability, guarantee, weight):
    """Every queue's deserved amount of dimension `d`, from the cluster's `total` down."""
    n = len(weight)
    demand = [0] * n

    def compute_demand(q):
        own = request[q][d]
        if tree.children[q]:
            children = 0
            for c in tree.children[q]:
                children = min(children + compute_demand(c), U64_MAX)
            own = max(own, children)
        demand[q] = min(own, capability[q][d])
        return demand[q]

    for r in tree.roots:
        compute_demand(r)
    out = [0] * n

    def split(children, amount):
        if not children:
            return
        guaranteed = [min(guarantee[c][d], demand[c]) for c in children]
        promised = sum(guaranteed)
        for c, g in zip(children, guaranteed):
            out[c] = g * amount // promised if promised > amount else g
        remaining = amount - sum(out[c] for c in children)
        active = [c for c in children if out[c] < demand[c]]
        while remaining > 0 and active:
            weights = sum(weight[c] for c in active)
            given = 0
            for c in active:
                give = min(remaining * weight[c] // weights, demand[c] - out[c])
                out[c] += give
                given += give
            if given == 0:
                # Less than one unit per weight is left: the heaviest unmet child takes it (the
                # first of equals).
                c = max(active, key=lambda c: (weight[c], -c))
                given = min(remaining, demand[c] - out[c])
                out[c] += given
            remaining -= given
            active = [c for c in active if out[c] < demand[c]]
        for c in children:
            split(tree.children[c], out[c])

    split(tree.roots, total)
    return out


def normalized_shares(tree, queues):
    """Each queue's share of the whole tree: its weight among its siblings times its parent's."""
    share = [0.0] * len(queues)

    def walk(level, parent):
        total = 0.0
        for q in level:
            total += float(queues[q].weight)
        for q in level:
            share[q] = parent * float(queues[q].weight) / total
            walk(tree.children[q], share[q])

    walk(tree.roots, 1.0)
    return share


wp.export(FairSharePolicy)
