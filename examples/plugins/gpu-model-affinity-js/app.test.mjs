// The Rust example's unit test, in JavaScript: the same scores for the same nodes (`node --test`,
// with the SDK beside the app as the build places it).
import assert from "node:assert/strict";
import { test } from "node:test";

import { Harness, gpu, node, task } from "./wasmsched_policy.js";
import { GpuModelAffinity } from "./app.js";

const one = (model) => node(model, [gpu(0, { model })]);

test("prefers models in order", () => {
  const h = new Harness(GpuModelAffinity, "H100, A100");
  assert.deepEqual(h.score(task({ gpus: 1 }), [one("H100"), one("A100"), one("T4")]), [100, 67, 0]);
});

test("refuses an empty list", () => {
  assert.throws(() => new Harness(GpuModelAffinity, " , "), /Error: name at least one GPU model/);
});
