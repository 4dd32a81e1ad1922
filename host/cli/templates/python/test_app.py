"""The policy's behaviour, natively, through the SDK's batch code (`./build.sh test` runs it)."""

import unittest

import wasmsched_policy as wp

import app


def node(name, free):
    """A node whose GPUs have these free shares (milli-GPU; 1000 is a whole free GPU)."""
    return wp.node(name, gpus=[wp.gpu(i, free_milli=f) for i, f in enumerate(free)])


class PolicyTest(unittest.TestCase):
    def test_prefers_nodes_with_more_idle_gpus(self):
        h = wp.Harness(app.Policy)
        nodes = [node("busy", [0, 300]), node("half", [1000, 300]), node("idle", [1000, 1000])]
        self.assertEqual(h.score(wp.task(), nodes), [0, 50, 100])


if __name__ == "__main__":
    unittest.main()
