// Builds a JavaScript policy into a component: node sdk/js/build.mjs APP_DIR OUT.wasm [WIT_DIR]
//
// APP_DIR holds `app.js` (and any modules it imports); the SDK (`wasmsched_policy.js`) is placed
// beside it for the build. The component targets the contract's `policy` world with every WASI
// feature of the JavaScript engine turned off: a policy sees no clock, randomness, console or
// network, as the host promises, and the component imports nothing but the contract.
import { componentize } from "@bytecodealliance/componentize-js";
import { cpSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const [app, out, wit = join(here, "..", "..", "wit")] = process.argv.slice(2);
if (!app || !out) {
  console.error("usage: node build.mjs APP_DIR OUT.wasm [WIT_DIR]");
  process.exit(2);
}
const work = mkdtempSync(join(tmpdir(), "wasmsched-js-"));
try {
  cpSync(resolve(app), work, { recursive: true });
  cpSync(join(here, "wasmsched_policy.js"), join(work, "wasmsched_policy.js"));
  const { component } = await componentize({
    sourcePath: join(work, "app.js"),
    witPath: resolve(wit),
    worldName: "policy",
    disableFeatures: ["stdio", "random", "clocks", "http", "fetch-event"],
  });
  writeFileSync(out, component);
  console.log(`built ${out} (${(component.length / 1e6).toFixed(1)} MB)`);
} finally {
  rmSync(work, { recursive: true, force: true });
}
