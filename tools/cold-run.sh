#!/usr/bin/env bash
# A cold `.ci/run` as CI sees it on a new machine: a fresh clone of HEAD, empty Go module
# and build caches, a new venv as `python3`, CI=true; timed as a whole and per step.
#
#   tools/cold-run.sh [DIR]     DIR (default: a new directory under /tmp) holds the clone,
#                               the caches, the venv and cold-run.log
#
# The log has setup's "setup: <step> took N s" lines, each pytest session's 30 slowest tests
# and modules, and the wall time at the end. Debian's packages cannot be made cold here:
# those already installed stay (apt-get takes about a minute on a new machine). Run it as
# root on a quiet machine: anything else running shares the two cores with the builds.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$(mktemp -d /tmp/cold-run.XXXXXX)}"
mkdir -p "$dir"
rm -rf "$dir/clone" "$dir/gocache" "$dir/gomodcache" "$dir/venv"
git clone -q --no-local "$repo" "$dir/clone"
python3 -m venv "$dir/venv"
log="$dir/cold-run.log"
echo "cold-run: clone of $(git -C "$repo" rev-parse --short HEAD) in $dir; log: $log"
start=$(date +%s)
set +e
(
    cd "$dir/clone"
    # The venv's python3 and pip first on PATH: setup installs into it, the tests run from it.
    export PATH="$dir/venv/bin:$PATH" GOCACHE="$dir/gocache" GOMODCACHE="$dir/gomodcache" CI=true
    bash .ci/run
) >"$log" 2>&1
rc=$?
set -e
wall=$(( $(date +%s) - start ))
echo "cold-run: exit $rc after ${wall} s" | tee -a "$log"
grep -E '^setup: .* took [0-9]+ s|^run-tests: |^tests: ' "$log" || true
exit "$rc"
