"""The Rust example's unit test, in Python: the same verdicts for the same nodes."""

import unittest

import wasmsched_policy as wp
from componentize_py_types import Err

import app


def node(*models):
    gpus = [wp.gpu(i, model, free_milli=free) for i, (model, free) in enumerate(models)]
    return wp.node("n", gpus=gpus)


class AdmitsOnlyListedModels(unittest.TestCase):
    def test_admits_gpu_tasks_only_where_enough_listed_gpus_are_free(self):
        h = wp.Harness(app.GpuModelFilter, "H100, A100")
        nodes = [node(("H100", 1000), ("A100", 1000)), node(("H100", 1000), ("H100", 500)), node(("T4", 1000), ("T4", 1000))]
        verdicts = h.filter(wp.task(gpus=2), nodes)
        self.assertEqual(verdicts, [None, "too few free GPUs of H100, A100", "no GPU of H100, A100"])
        self.assertEqual(h.filter(wp.task(), nodes), [None, None, None])

    def test_refuses_an_empty_list(self):
        with self.assertRaises(Err) as refused:
            wp.Harness(app.GpuModelFilter, " , ")
        self.assertIn("ValueError: name at least one GPU model", refused.exception.value)


if __name__ == "__main__":
    unittest.main()
