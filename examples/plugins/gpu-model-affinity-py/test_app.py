"""The Rust example's unit test, in Python: the same scores for the same nodes."""

import unittest

import wasmsched_policy as wp
from componentize_py_types import Err

import app


def node(model):
    return wp.node(model, gpus=[wp.gpu(0, model)])


class PrefersModelsInOrder(unittest.TestCase):
    def test_prefers_models_in_order(self):
        h = wp.Harness(app.GpuModelAffinity, "H100, A100")
        scores = h.score(wp.task(gpus=1), [node("H100"), node("A100"), node("T4")])
        self.assertEqual(scores, [100, 67, 0])

    def test_refuses_an_empty_list(self):
        with self.assertRaises(Err) as refused:
            wp.Harness(app.GpuModelAffinity, " , ")
        self.assertIn("ValueError: name at least one GPU model", refused.exception.value)


if __name__ == "__main__":
    unittest.main()
