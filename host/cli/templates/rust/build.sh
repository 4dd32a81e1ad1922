#!/usr/bin/env bash
# Builds the component and pins it in policy.yaml; `./build.sh test` runs the unit tests first.
set -euo pipefail
cd "$(dirname "$0")"
if [ "${1:-}" = test ]; then
    cargo test
fi
cargo build --release --target wasm32-wasip2
cp target/wasm32-wasip2/release/{{CRATE}}.wasm {{NAME}}.wasm
cat > policy.yaml <<YAML
name: {{NAME}}
plugins:
  fit: { source: "builtin:resource-fit" }
  {{NAME}}:
    source: "file:{{NAME}}.wasm"
    digest: "$(wasmsched policy digest {{NAME}}.wasm)"
stages:
  filter: [fit]
  score: [{ plugin: {{NAME}}, weight: 1 }]
YAML
echo "built {{NAME}}.wasm; next: wasmsched plugin check {{NAME}}.wasm && wasmsched policy check policy.yaml"
