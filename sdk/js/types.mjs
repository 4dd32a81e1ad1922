// TypeScript declarations of the policy contract, generated from `wit/policy.wit` (never copied by
// hand): node sdk/js/types.mjs [OUT_DIR] [WIT_FILE] — default OUT_DIR is sdk/js/types, which is
// checked in; a test regenerates it and fails when it is stale.
//
// The WIT source is handed to jco's type generator as text: given a path, the generator (itself a
// component) reads it through its own sandboxed filesystem, which does not see the host's paths.
import { generateTypes, $init } from "@bytecodealliance/jco-transpile/component";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const [out = join(here, "types"), wit = join(here, "..", "..", "wit", "policy.wit")] = process.argv.slice(2);
await $init;
const files = generateTypes("policy", {
  wit: { tag: "source", val: readFileSync(resolve(wit), "utf8") },
  world: "policy",
  features: { tag: "list", val: [] },
  guest: true,
  tlaCompat: false,
});
rmSync(out, { recursive: true, force: true });
for (const [name, text] of files) {
  const path = join(out, name);
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text);
}
console.log(`wrote ${files.length} declaration files to ${out}`);
