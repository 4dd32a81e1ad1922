#!/usr/bin/env bash
# Builds {{NAME}}.wasm with componentize-py 0.25.1 and pins it in policy.yaml; `./build.sh test`
# runs the unit tests first. The SDK (wasmsched_policy.py) and the contract (wit/) are the copies
# `wasmsched plugin new` wrote.
set -euo pipefail
cd "$(dirname "$0")"
if [ "${1:-}" = test ]; then
    [ -d bindings ] || componentize-py -d wit -w policy bindings bindings
    PYTHONPATH=bindings:. PYTHONDONTWRITEBYTECODE=1 python3 -m unittest -v
fi
componentize-py -d wit -w policy componentize -p . app -o {{NAME}}.wasm
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
