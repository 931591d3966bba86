#!/usr/bin/env bash
# The modern Packers the test suite builds on (1.9.4, 1.16.0) and their plugins, for CI and developers:
#   1. Packer and the newest plugins from the release sources in ../shared/packer-src, built by
#      ../shared/tools/build-packer.sh into ~/.cache/packer-from-source (kept while the sources do not change);
#   2. the plugin floors (the lowest versions required_plugins allows) from the Go module proxy, by
#      scripts/build_plugin_floors.py into ~/.cache/image-builder/packer-plugin-floors (kept likewise).
# Users do not need this: they get Packer from HashiCorp and plugins with `packer init` (see docs/packer.md).
set -euo pipefail
cd "$(dirname "$0")/.."
shared=../shared/tools/build-packer.sh
if [ ! -x "$shared" ]; then
  echo "modern-packers.sh: $shared is not there (it is beside the project in CI)" >&2
  exit 1
fi
# Go's module download lines are dropped (thousands of them); a failure still fails the pipeline (pipefail)
"$shared" 2>&1 | { grep -v '^go: downloading' || true; }
.venv/bin/python scripts/build_plugin_floors.py 2>&1 | { grep -v '^go: downloading' || true; }
