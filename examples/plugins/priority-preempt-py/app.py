"""priority-preempt in Python: the built-in preempt policy (`plugins/priority-preempt`), decision for
decision. For a task that fits nowhere it picks, among the victims the host allows on each
candidate node, the cheapest set that makes room:

1. victims running under their minimum-runtime protection, or (same queue, not elastic surplus)
   less than `min_priority_diff` below the preemptor, are never chosen;
2. on each node, victims are added cheapest first until the preemptor fits, then any victim that
   turns out unnecessary is dropped again (most expensive first). Cheapest: elastic surplus first,
   then lowest priority, then least GPU-time lost, then the host's order;
3. across nodes a plan of elastic surplus only wins, then the lowest highest victim priority, then
   the least GPU-time lost, then the fewest victims, then the earliest candidate.

GPU-time lost: none for a checkpointable victim, else running time × GPUs; a victim that breaks its
gang loses the whole running gang's work (its own × the members running, counted once per gang).

Configuration (JSON, all optional): `{"min_priority_diff": 1, "min_runtime_seconds": 0,
"max_victims": 0}` (`max_victims` 0 = no limit).
"""

import json

import wasmsched_policy as wp
from wasmsched_policy import *  # noqa: F401,F403 - the contract's exports, looked up here

KNOWN = {"min_priority_diff", "min_runtime_seconds", "max_victims"}


def surplus(v) -> bool:
    """An elastic member above its group's min-member: evicting it leaves the group running."""
    return v.group_running > v.group_min_member


def breaks_group(v) -> bool:
    """A non-surplus member of a group: evicting it takes the whole running group down."""
    return v.task.group is not None and not surplus(v)


def lost_gpu_seconds(v) -> int:
    if v.checkpointable:
        return 0
    own = v.running_seconds * (v.task.gpu.count * v.task.gpu.milli_per_gpu) // 1000
    return own * max(v.group_running, 1) if breaks_group(v) else own


def fits_after(task, node, victims) -> bool:
    """Estimate (from node totals) whether `task` fits `node` once `victims` are gone."""

    def freed(f):
        return sum(f(v.task) for v in victims)

    free_cpu = max(0, node.allocatable.cpu_milli - node.allocated.cpu_milli)
    free_memory = max(0, node.allocatable.memory_bytes - node.allocated.memory_bytes)
    if free_cpu + freed(lambda t: t.request.cpu_milli) < task.request.cpu_milli:
        return False
    if free_memory + freed(lambda t: t.request.memory_bytes) < task.request.memory_bytes:
        return False
    for name, want in task.request.extended:
        free = max(0, wp.extended(node.allocatable, name) - wp.extended(node.allocated, name))
        if free + freed(lambda t: wp.extended(t.request, name)) < want:
            return False
    req = task.gpu
    if req.count == 0:
        return True
    usable = [
        g
        for g in node.gpus
        if g.health != wp.types.GpuHealth.UNHEALTHY and (not req.models or g.model in req.models)
    ]
    if req.milli_per_gpu >= wp.GPU_MILLI:
        idle = sum(1 for g in usable if g.free_milli >= wp.GPU_MILLI)
        whole_freed = freed(lambda t: t.gpu.count if t.gpu.milli_per_gpu >= wp.GPU_MILLI else 0)
        return idle + whole_freed >= req.count
    shared_freed = freed(lambda t: t.gpu.count * t.gpu.milli_per_gpu)
    return any(g.free_milli + shared_freed >= req.milli_per_gpu for g in usable)


class PriorityPreempt(wp.Policy):
    name = "priority-preempt"

    def __init__(self, config: str):
        settings = json.loads(config) if config.strip() else {}
        unknown = set(settings) - KNOWN
        if unknown:
            raise ValueError(f"invalid {self.name} configuration: unknown field {sorted(unknown)[0]!r}")
        self.min_priority_diff = settings.get("min_priority_diff", 1)
        self.min_runtime_seconds = settings.get("min_runtime_seconds", 0)
        self.max_victims = settings.get("max_victims", 0)
        if self.min_priority_diff < 1:
            raise ValueError(
                f"invalid {self.name} configuration: min_priority_diff must be at least 1 "
                "(equal priorities never preempt each other)"
            )

    def eligible(self, preemptor, v) -> bool:
        if v.running_seconds < self.min_runtime_seconds:
            return False
        if v.task.queue == preemptor.queue and not surplus(v):
            return preemptor.priority - v.task.priority >= self.min_priority_diff
        return True

    def plan_node(self, preemptor, c, node):
        """The cheapest victims on one node, by index, with their cost; None when not enough."""
        victims = c.victims
        order = [i for i in range(len(victims)) if self.eligible(preemptor, victims[i])]
        order.sort(key=lambda i: (not surplus(victims[i]), victims[i].task.priority, lost_gpu_seconds(victims[i]), i))
        chosen = []

        def refs(indices):
            return [victims[i] for i in indices]

        if not fits_after(preemptor, node, []):
            for i in order:
                chosen.append(i)
                if fits_after(preemptor, node, refs(chosen)):
                    break
            if not fits_after(preemptor, node, refs(chosen)):
                return None
            # Drop victims that turned out unnecessary, most expensive first.
            for position in reversed(range(len(chosen))):
                without = chosen[:position] + chosen[position + 1 :]
                if fits_after(preemptor, node, refs(without)):
                    chosen = without
        if not chosen:
            # The estimate says it fits already; the host found otherwise. Offer nothing here.
            return None
        if self.max_victims > 0 and len(chosen) > self.max_victims:
            return None
        return chosen, self.cost(c, chosen)

    def cost(self, c, chosen):
        victims = [c.victims[i] for i in chosen]
        total = 0
        lost = 0
        groups = set()
        for v in victims:
            if breaks_group(v):
                key = (v.task.namespace, v.task.group)
                if key not in groups:
                    groups.add(key)
                    total += max(v.group_running, 1)
                    lost += lost_gpu_seconds(v)
            else:
                total += 1
                lost += lost_gpu_seconds(v)
        return (
            any(not surplus(v) for v in victims),
            max((v.task.priority for v in victims), default=-(2**31)),
            lost,
            total,
        )

    def select_victims(self, preemptor, candidates, nodes):
        best = None
        for index, (c, node) in enumerate(zip(candidates, nodes)):
            plan = self.plan_node(preemptor, c, node)
            if plan is not None and (best is None or plan[1] < best[0]):
                best = (plan[1], index, plan[0])
        if best is None:
            return None
        return best[1], best[2]


wp.export(PriorityPreempt)
