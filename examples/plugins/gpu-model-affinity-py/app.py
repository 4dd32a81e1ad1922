"""gpu-model-affinity in Python: the Rust example (`../gpu-model-affinity`), decision for decision.

Scores a node by how early its best free GPU model appears in a preference list. Configuration: a
comma-separated list, most preferred first, e.g. `H100,A100`.
"""

import wasmsched_policy as wp
from wasmsched_policy import *  # noqa: F401,F403 - the contract's exports, which componentize-py looks up here


class GpuModelAffinity(wp.Policy):
    name = "gpu-model-affinity"

    def __init__(self, config: str):
        preferred = [m.strip() for m in config.split(",") if m.strip()]
        if not preferred:
            raise ValueError('name at least one GPU model, e.g. "H100,A100"')
        # Model → its place in the list (the first mention counts, as in the Rust version).
        self.rank = {}
        for position, model in enumerate(preferred):
            self.rank.setdefault(model, position)
        self.count = len(preferred)

    def score(self, task, node) -> int:
        best = None
        for gpu in node.gpus:
            rank = self.rank.get(gpu.model)
            if rank is not None and (best is None or rank < best) and wp.fits_device(task.gpu, gpu):
                best = rank
        if best is None:
            return 0
        # First choice 100, then evenly down to a floor above 0 for the last listed model.
        return wp.MAX_SCORE - best * wp.MAX_SCORE // (self.count + 1)


wp.export(GpuModelAffinity)
