"""gpu-model-filter in Python: the Rust example (`../gpu-model-filter`), verdict for verdict.

A task that asks for GPUs fits only a node with enough free GPUs of the listed models. A node
without any GPU of those models is unresolvable (preemption cannot change hardware); one with too
few free is plain unfit. Configuration: a comma-separated list of models, e.g. `H100,A100`.
"""

import wasmsched_policy as wp
from wasmsched_policy import *  # noqa: F401,F403 - the contract's exports, which componentize-py looks up here


class GpuModelFilter(wp.Policy):
    name = "gpu-model-filter"

    def __init__(self, config: str):
        self.models = [m.strip() for m in config.split(",") if m.strip()]
        if not self.models:
            raise ValueError('name at least one GPU model, e.g. "H100,A100"')
        listed = ", ".join(self.models)
        # The verdicts, made once: a filter answers for every node of every cycle.
        self.none = wp.unresolvable(f"no GPU of {listed}")
        self.too_few = wp.unfit(f"too few free GPUs of {listed}")

    def filter(self, task, node):
        want = task.gpu.count
        if want == 0:
            return None
        listed = [g for g in node.gpus if g.model in self.models]
        if not listed:
            return self.none
        free = sum(1 for g in listed if wp.fits_device(task.gpu, g))
        return None if free >= want else self.too_few


wp.export(GpuModelFilter)
