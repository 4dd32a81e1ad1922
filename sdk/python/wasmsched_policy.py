"""wasmsched policies in Python.

A policy is one class: its name, a constructor that takes the configuration text, and the stage
methods it implements, each about one task and one node (or one set of queues). This module keeps
the guest-side copy of the nodes the host sends (the `mirror`), answers the host's batch calls
(`filter` and `score` over many candidate slots, the `placement` calls that carry usage changes,
`fair-share-delta`) and turns a Python exception into a plugin fault that says where it was raised.

    import wasmsched_policy as wp

    class PreferH100(wp.Policy):
        name = "prefer-h100"

        def score(self, task, node):
            return 100 if any(g.model == "H100" for g in node.gpus) else 0

    wp.export(PreferH100)

The component is built against the contract's `policy` world, whose types (`Task`, `Node`, ...)
componentize-py generates from `wit/policy.wit` (`componentize-py -d wit -w policy bindings DIR`
writes them for an editor):

    componentize-py -d wit -w policy componentize -p sdk/python -p DIR app -o app.wasm

Stage methods, all optional (the stages declared to the host are the ones the class defines):

- ``filter(task, node)``: ``None`` (or ``True``) when it fits; a string, ``False`` or
  ``wp.unfit(reason)`` when it does not (preemption may help); ``wp.unresolvable(reason)`` when
  nothing can help (a node-selector mismatch).
- ``score(task, node)``: an integer, clamped to 0..100.
- ``select_victims(preemptor, candidates, nodes)``: ``None`` or ``(candidate index, [victim
  indices])``; ``nodes[i]`` is the node of ``candidates[i]``.
- ``fair_share(queues, cluster)``: ``(deserved, order)``, one ``Resources`` per queue and the
  queues' indices in the order they are served.
- ``select_devices(task, node)``: a list of ``(gpu index, milli)``, or a string saying why not.
"""

import traceback

from componentize_py_types import Err
from wit_world.exports import filter as _filter
from wit_world.exports import fair_share as _fair_share
from wit_world.exports import fair_share_delta as _fair_share_delta
from wit_world.exports import placement as _placement
from wit_world.exports import plugin as _plugin
from wit_world.exports import preempt as _preempt
from wit_world.exports import select_devices as _select_devices
from wit_world.imports import host as _host
from wit_world.imports import types

SDK_VERSION = "wasmsched-python/0.1.0"
MAX_SCORE = 100
GPU_MILLI = 1000

# The stage methods a policy class may define, and the contract stage each declares.
_STAGES = (
    ("filter", types.Stage.FILTER),
    ("score", types.Stage.SCORE),
    ("select_victims", types.Stage.PREEMPT),
    ("fair_share", types.Stage.FAIR_SHARE),
    ("select_devices", types.Stage.SELECT_DEVICES),
)


class Policy:
    """Base class of a policy: set ``name`` and define the stage methods you implement."""

    name = "python-policy"

    def __init__(self, config: str):
        if config.strip():
            raise ValueError(f"{self.name} takes no configuration, got {config!r}")


class Verdict:
    """A filter's answer for one node: it does not fit, and why."""

    __slots__ = ("reason", "unresolvable")

    def __init__(self, reason: str, unresolvable: bool):
        self.reason = reason
        self.unresolvable = unresolvable


def unfit(reason: str) -> Verdict:
    """The node does not fit now; preemption may help."""
    return Verdict(reason, False)


def unresolvable(reason: str) -> Verdict:
    """The node cannot fit whatever is evicted (preemption skips it)."""
    return Verdict(reason, True)


def log(message: str, level=None) -> None:
    """Log through the host (rate-limited and truncated there), attributed to the plugin."""
    _host.log(level if level is not None else _host.LogLevel.INFO, message)


def export(cls) -> None:
    """Makes `cls` the policy this component serves."""
    global _factory
    _factory = cls


# ---- helpers for policy authors ----------------------------------------------------------------


def fits_device(request: types.GpuRequest, gpu: types.GpuDevice) -> bool:
    """Whether one device can serve one GPU of `request` now (share, memory, model, health)."""
    if gpu.health == types.GpuHealth.UNHEALTHY:
        return False
    if request.models and gpu.model not in request.models:
        return False
    return gpu.free_milli >= request.milli_per_gpu and gpu.free_memory_bytes >= request.memory_bytes_per_gpu


def extended(resources: types.Resources, name: str) -> int:
    """The amount of extended resource `name` in `resources` (0 when absent)."""
    for key, value in resources.extended:
        if key == name:
            return value
    return 0


# ---- building records, for tests -----------------------------------------------------------------


def resources(cpu_milli=0, memory_bytes=0, gpu_milli=0, extended=()) -> types.Resources:
    """A `Resources` record (extended resources as `(name, amount)` pairs)."""
    return types.Resources(cpu_milli=cpu_milli, memory_bytes=memory_bytes, gpu_milli=gpu_milli, extended=sorted(extended))


def gpu(index=0, model="", memory_bytes=80 << 30, free_milli=GPU_MILLI, free_memory_bytes=None, health=None, numa_node=None):
    """A `GpuDevice` record: entirely free unless told otherwise."""
    return types.GpuDevice(
        index=index,
        model=model,
        memory_bytes=memory_bytes,
        free_milli=free_milli,
        free_memory_bytes=memory_bytes if free_memory_bytes is None else free_memory_bytes,
        health=types.GpuHealth.HEALTHY if health is None else health,
        numa_node=numa_node,
    )


def node(name="node", gpus=(), labels=(), allocatable=None, allocated=None, unschedulable=False) -> types.Node:
    """A `Node` record; `allocatable` defaults to what its GPUs add up to."""
    if allocatable is None:
        allocatable = resources(gpu_milli=GPU_MILLI * len(gpus))
    return types.Node(
        name=name,
        labels=sorted(labels),
        taints=[],
        allocatable=allocatable,
        allocated=allocated if allocated is not None else resources(),
        gpus=list(gpus),
        unschedulable=unschedulable,
    )


def task(id="task", gpus=0, milli_per_gpu=GPU_MILLI, models=(), queue="default", priority=0, cpu_milli=0) -> types.Task:
    """A `Task` record asking for `gpus` devices (each `milli_per_gpu` of one)."""
    return types.Task(
        id=id,
        namespace="default",
        group=None,
        queue=queue,
        priority=priority,
        qos=types.Qos.BURSTABLE,
        request=resources(cpu_milli=cpu_milli, gpu_milli=gpus * milli_per_gpu),
        gpu=types.GpuRequest(count=gpus, milli_per_gpu=milli_per_gpu, memory_bytes_per_gpu=0, models=list(models)),
        node_selector=[],
        node_affinity=types.NodeAffinity(required=[], preferred=[]),
        tolerations=[],
    )


class Harness:
    """Runs a policy natively through the same batch code the component runs (init, the mirror,
    the stage calls, exceptions as errors), for `python3 -m unittest` without a component."""

    def __init__(self, cls, config: str = ""):
        export(cls)
        self.info = Plugin().init(config)

    def _mirror(self, nodes):
        Mirror().reset(1, len(nodes))
        Mirror().upsert(1, list(enumerate(nodes)))
        return list(range(len(nodes)))

    def score(self, task, nodes):
        """One score per node."""
        return Score().score(task, self._mirror(nodes))

    def filter(self, task, nodes):
        """Per node: None when it fits, else the reason."""
        result = Filter().filter(task, self._mirror(nodes))
        return [None if code == 0 else result.reasons[code - 1].reason for code in result.codes]


# ---- the guest side of the contract ------------------------------------------------------------

_factory = None
_policy = None
_nodes: list = []
_generation = 0


class _Fault(Exception):
    pass


def _described(e: BaseException) -> str:
    """`Type: message (file.py line N, in function)`, at the innermost frame of the policy's code."""
    frames = traceback.extract_tb(e.__traceback__)
    own = [f for f in frames if not f.filename.endswith("wasmsched_policy.py")] or frames
    where = f" ({own[-1].filename.rsplit('/', 1)[-1]} line {own[-1].lineno}, in {own[-1].name})" if own else ""
    text = str(e)
    return f"{type(e).__name__}: {text}{where}" if text else f"{type(e).__name__}{where}"


def _guarded(stage: str, call):
    """Runs `call`; a Python exception becomes the stage's error, in the author's words."""
    try:
        return call()
    except Err:
        raise
    except _Fault as e:
        raise Err(str(e))
    except BaseException as e:  # noqa: BLE001 - every exception is the plugin's fault, reported
        raise Err(f"{stage}: {_described(e)}")


def _policy_or_fault():
    if _policy is None:
        raise _Fault("the policy was not initialised")
    return _policy


def _node(slot: int):
    node = _nodes[slot] if slot < len(_nodes) else None
    if node is None:
        raise _Fault(f"slot {slot} is not in the mirror (generation {_generation})")
    return node


def _apply_usage(usage) -> None:
    """Usage changes, all or nothing: a slot not held, or another device count, changes nothing."""
    for slot, u in usage:
        node = _nodes[slot] if slot < len(_nodes) else None
        if node is None or len(node.gpus) != len(u.gpus):
            raise _Fault(f"usage for slot {slot} does not match the mirror")
    for slot, u in usage:
        node = _nodes[slot]
        node.allocated = u.allocated
        for gpu, g in zip(node.gpus, u.gpus):
            gpu.free_milli = g.free_milli
            gpu.free_memory_bytes = g.free_memory_bytes


def _full_task(task) -> types.Task:
    if isinstance(task, _placement.StageTask_Full):
        return task.value
    b = task.value
    return types.Task(
        id=b.id,
        namespace=b.namespace,
        group=b.group,
        queue=b.queue,
        priority=b.priority,
        qos=b.qos,
        request=types.Resources(cpu_milli=b.cpu_milli, memory_bytes=b.memory_bytes, gpu_milli=b.gpu_milli, extended=[]),
        gpu=types.GpuRequest(
            count=b.gpu_count, milli_per_gpu=b.milli_per_gpu, memory_bytes_per_gpu=b.memory_bytes_per_gpu, models=[]
        ),
        node_selector=[],
        node_affinity=types.NodeAffinity(required=[], preferred=[]),
        tolerations=[],
    )


def _filter_batch(task, candidates, enough):
    policy = _policy_or_fault()
    codes = []
    reasons = []
    index = {}
    fits = 0
    for slot in candidates:
        verdict = policy.filter(task, _node(slot))
        if verdict is None or verdict is True:
            codes.append(0)
            fits += 1
            if enough is not None and fits >= enough:
                break
            continue
        if verdict is False:
            verdict = unfit("does not fit")
        elif isinstance(verdict, str):
            verdict = unfit(verdict)
        key = (verdict.reason, verdict.unresolvable)
        if key not in index:
            reasons.append(types.Rejection(reason=verdict.reason, unresolvable=verdict.unresolvable))
            index[key] = len(reasons)
        codes.append(index[key])
    return _filter.FilterResult(codes=codes, reasons=reasons)


def _score_batch(task, candidates):
    policy = _policy_or_fault()
    return [max(0, min(MAX_SCORE, int(policy.score(task, _node(slot))))) for slot in candidates]


class Plugin:
    def init(self, config: str) -> _plugin.PluginInfo:
        global _policy
        if _factory is None:
            raise Err("no policy exported: call wasmsched_policy.export(YourPolicy) in the app module")

        def make():
            global _policy
            _policy = _factory(config)

        _guarded("init", make)
        stages = [stage for method, stage in _STAGES if callable(getattr(_policy, method, None))]
        if not stages:
            raise Err(f"{_policy.name} defines no stage method (filter, score, select_victims, fair_share, select_devices)")
        return _plugin.PluginInfo(name=_policy.name, stages=stages, sdk_version=SDK_VERSION)


class Mirror:
    def reset(self, generation: int, slots: int) -> None:
        global _nodes, _generation
        _nodes = [None] * slots
        _generation = generation

    def upsert(self, generation: int, nodes) -> None:
        global _generation
        _generation = generation
        for slot, node in nodes:
            if slot >= len(_nodes):
                _nodes.extend([None] * (slot + 1 - len(_nodes)))
            _nodes[slot] = node

    def remove(self, generation: int, slots) -> None:
        global _generation
        _generation = generation
        for slot in slots:
            if slot < len(_nodes):
                _nodes[slot] = None


class MirrorUsage:
    def update_usage(self, generation: int, nodes) -> None:
        global _generation
        _guarded("update-usage", lambda: _apply_usage(nodes))
        _generation = generation


class Filter:
    def filter(self, task, candidates):
        return _guarded("filter", lambda: _filter_batch(task, candidates, None))


class Score:
    def score(self, task, candidates):
        return _guarded("score", lambda: _score_batch(task, candidates))


class Placement:
    def _stage(self, stage, generation, usage, run):
        global _generation
        try:
            _apply_usage(usage)
        except _Fault as e:
            raise Err(_placement.StageError_OutOfStep(str(e)))
        _generation = generation
        try:
            return _guarded(stage, run)
        except Err as e:
            raise Err(_placement.StageError_Failed(e.value))

    def filter(self, generation, usage, task, candidates, enough):
        return self._stage("filter", generation, usage, lambda: _filter_batch(_full_task(task), candidates, enough))

    def score(self, generation, usage, task, candidates):
        return self._stage("score", generation, usage, lambda: _score_batch(_full_task(task), candidates))


class SelectDevices:
    def select_devices(self, task, node):
        def run():
            answer = _policy_or_fault().select_devices(task, _node(node))
            if isinstance(answer, str):
                return Err(types.Rejection(reason=answer, unresolvable=False))
            if isinstance(answer, Verdict):
                return Err(types.Rejection(reason=answer.reason, unresolvable=answer.unresolvable))
            from componentize_py_types import Ok

            return Ok([_select_devices.DeviceShare(gpu=gpu, milli=milli) for gpu, milli in answer])

        return _guarded("select-devices", run)


class SelectClaimDevices:
    def rank(self, task, node, request):
        raise Err("select-claim-devices is not implemented by Python policies")


class Preempt:
    def select_victims(self, preemptor, candidates):
        def run():
            nodes = [_node(c.node) for c in candidates]
            answer = _policy_or_fault().select_victims(preemptor, candidates, nodes)
            if answer is None:
                return None
            candidate, victims = answer
            return _preempt.Preemption(candidate=candidate, victims=list(victims))

        return _guarded("preempt", run)


def _share(queues, cluster):
    deserved, order = _policy_or_fault().fair_share(queues, cluster)
    if len(deserved) != len(queues):
        raise _Fault(f"fair_share returned {len(deserved)} deserved shares for {len(queues)} queues")
    return list(deserved), list(order)


class FairShare:
    def compute(self, queues, cluster):
        def run():
            deserved, order = _share(queues, cluster)
            return _fair_share.ShareDecision(deserved=deserved, order=order)

        return _guarded("fair-share", run)


_queues: list = []
_deserved: list = []


class FairShareDelta:
    def compute_changed(self, reset, count, changed, cluster):
        def run():
            global _queues, _deserved
            if reset:
                _queues = [None] * count
                _deserved = [None] * count
            elif count != len(_queues):
                _queues.extend([None] * (count - len(_queues)))
                del _queues[count:]
                _deserved.extend([None] * (count - len(_deserved)))
                del _deserved[count:]
            for index, queue in changed:
                _queues[index] = queue
            if any(q is None for q in _queues):
                raise _Fault("fair-share-delta: a queue was never sent")
            deserved, order = _share(_queues, cluster)
            delta = [(i, d) for i, d in enumerate(deserved) if d != _deserved[i]]
            _deserved = deserved
            return _fair_share_delta.ShareDelta(deserved=delta, order=order)

        return _guarded("fair-share", run)


# componentize-py looks the exported interfaces up in the app module: `from wasmsched_policy
# import *` there brings these.
__all__ = [
    "Plugin",
    "Mirror",
    "MirrorUsage",
    "Filter",
    "Score",
    "Placement",
    "SelectDevices",
    "SelectClaimDevices",
    "Preempt",
    "FairShare",
    "FairShareDelta",
]

