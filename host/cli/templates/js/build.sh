#!/usr/bin/env bash
# Builds {{NAME}}.wasm with componentize-js 0.23.0 (installed here by `npm ci` on first use, as
# package-lock.json pins it) and pins it in policy.yaml; `./build.sh test` runs the unit tests
# first. The SDK (wasmsched_policy.js, build.mjs) and the contract (wit/) are the copies
# `wasmsched plugin new` wrote.
set -euo pipefail
cd "$(dirname "$0")"
[ -d node_modules/@bytecodealliance/componentize-js ] || npm ci --silent --no-audit --no-fund
if [ "${1:-}" = test ]; then
    node --test app.test.mjs
fi
mkdir -p .build
cp app.js .build/
node build.mjs .build {{NAME}}.wasm wit
cat > policy.yaml <<YAML
name: {{NAME}}
plugins:
  fit: { source: "builtin:resource-fit" }
  {{NAME}}:
    source: "file:{{NAME}}.wasm"
    digest: "$(wasmsched policy digest {{NAME}}.wasm)"
    # The JavaScript engine's heap grows past the default 64 MiB before it collects.
    memory_mib: 256
stages:
  filter: [fit]
  score: [{ plugin: {{NAME}}, weight: 1 }]
YAML
echo "built {{NAME}}.wasm; next: wasmsched plugin check {{NAME}}.wasm && wasmsched policy check policy.yaml"
