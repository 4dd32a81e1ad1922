// The policy's behaviour, natively, through the SDK's batch code (`./build.sh test` runs it).
import assert from "node:assert/strict";
import { test } from "node:test";

import { Harness, gpu, node, task } from "./wasmsched_policy.js";
import { ThePolicy } from "./app.js";

const withFree = (name, free) => node(name, free.map((f, i) => gpu(i, { freeMilli: f })));

test("prefers nodes with more idle GPUs", () => {
  const h = new Harness(ThePolicy);
  const nodes = [withFree("busy", [0, 300]), withFree("half", [1000, 300]), withFree("idle", [1000, 1000])];
  assert.deepEqual(h.score(task(), nodes), [0, 50, 100]);
});
