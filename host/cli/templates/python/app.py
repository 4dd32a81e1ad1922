"""{{NAME}}: a score policy. It prefers nodes whose GPUs are entirely free (spreading work);
replace `score` with your own, or add `filter`, `select_victims`, `fair_share`, `select_devices`
(sdk/python/README.md in the wasmsched repository says what each returns)."""

import wasmsched_policy as wp
from wasmsched_policy import *  # noqa: F401,F403 - the contract's exports, looked up here


class Policy(wp.Policy):
    name = "{{NAME}}"

    def score(self, task, node) -> int:
        if not node.gpus:
            return 0
        idle = sum(1 for g in node.gpus if g.free_milli == wp.GPU_MILLI)
        return idle * wp.MAX_SCORE // len(node.gpus)


wp.export(Policy)
