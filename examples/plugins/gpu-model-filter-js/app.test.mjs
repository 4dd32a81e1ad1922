// The Rust example's unit test, in JavaScript: the same verdicts for the same nodes (`node --test`,
// with the SDK beside the app as the build places it).
import assert from "node:assert/strict";
import { test } from "node:test";

import { Harness, gpu, node, task } from "./wasmsched_policy.js";
import { GpuModelFilter } from "./app.js";

const gpus = (...models) => node("n", models.map(([model, freeMilli], i) => gpu(i, { model, freeMilli })));

test("admits GPU tasks only where enough listed GPUs are free", () => {
  const h = new Harness(GpuModelFilter, "H100, A100");
  const nodes = [gpus(["H100", 1000], ["A100", 1000]), gpus(["H100", 1000], ["H100", 500]), gpus(["T4", 1000], ["T4", 1000])];
  assert.deepEqual(h.filter(task({ gpus: 2 }), nodes), [null, "too few free GPUs of H100, A100", "no GPU of H100, A100"]);
  assert.deepEqual(h.filter(task(), nodes), [null, null, null]);
});

test("refuses an empty list", () => {
  assert.throws(() => new Harness(GpuModelFilter, " , "), /Error: name at least one GPU model/);
});
