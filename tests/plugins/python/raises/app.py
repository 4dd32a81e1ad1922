"""A Python policy that fails the way authors' code does, by configuration."""

import wasmsched_policy as wp
from wasmsched_policy import *  # noqa: F401,F403


class Raises(wp.Policy):
    name = "raises"

    def __init__(self, config: str):
        if config == "bad-config":
            raise ValueError("unknown mode 'bad-config'")
        self.mode = config

    def score(self, task, node) -> int:
        if self.mode == "divide":
            return 100 // len(task.tolerations)
        if self.mode == "key":
            return {"a": 1}[node.name]
        return 50

    def filter(self, task, node):
        if self.mode == "loop":
            while True:
                pass
        return None if node.name.endswith("0") else wp.unfit("not a node ending in 0")


wp.export(Raises)
