#!/usr/bin/env bash
# What `make test` runs after setup, lint and unit-nonroot: every test, in two pytest sessions
# side by side. The e2e package (tests/e2e: real clusters, mostly waiting on pods, nodes and
# timers) runs in one, every other test in the other, so the waiting of the one overlaps the
# work of the other on the second core. Each measures branch coverage into files of its own;
# one report over both holds the floor. Each session prints its 30 slowest tests and modules.
#
#   tools/run-tests.sh [PYTEST_ARGS...]    extra arguments go to both sessions
#   SERIAL=1 tools/run-tests.sh            one session after the other (to compare)
#
# Exit status: the first failure of the two sessions, else the coverage floor's.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
floor=${COVERAGE_FLOOR:-95}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
rm -f .coverage .coverage-e2e* .coverage-others*
# Both sessions build the project's image; the base they share is made once, first, so the
# two never import it at the same time (buildah's storage is one for both).
if command -v buildah >/dev/null && [ "$(id -u)" = 0 ]; then
    tools/build-image.sh --base-only >"$logs/base.log" 2>&1 || cat "$logs/base.log"
fi
common=(-p no:cacheprovider --cov --cov-report= --durations=30)

e2e() { COVERAGE_FILE="$PWD/.coverage-e2e" "$py" -m pytest "${common[@]}" "$@" tests/e2e; }
others() { COVERAGE_FILE="$PWD/.coverage-others" "$py" -m pytest "${common[@]}" "$@" --ignore=tests/e2e; }

start=$(date +%s)
if [ "${SERIAL:-0}" = 1 ]; then
    others "$@" 2>&1 | tee "$logs/others.log"
    others_rc=${PIPESTATUS[0]}
    e2e "$@" 2>&1 | tee "$logs/e2e.log"
    e2e_rc=${PIPESTATUS[0]}
else
    echo "run-tests: tests/e2e runs beside the other tests; its output follows theirs"
    e2e "$@" >"$logs/e2e.log" 2>&1 &
    e2e_pid=$!
    others "$@" 2>&1 | tee "$logs/others.log"
    others_rc=${PIPESTATUS[0]}
    wait "$e2e_pid"
    e2e_rc=$?
    echo "================================ tests/e2e ================================"
    cat "$logs/e2e.log"
fi
echo "run-tests: both sessions done in $(( $(date +%s) - start )) s"

"$py" -m coverage combine --data-file=.coverage .coverage-e2e .coverage-others >/dev/null
"$py" -m coverage report --fail-under="$floor" | tail -n 3
cover_rc=${PIPESTATUS[0]}

# One closing line for both sessions, in pytest's words.
"$py" - "$logs/others.log" "$logs/e2e.log" <<'EOF'
import re
import sys

counts = {"passed": 0, "failed": 0, "skipped": 0}
for path in sys.argv[1:]:
    lines = [line for line in open(path, errors="replace") if re.search(r"\d+ (passed|failed|errors?)\b", line)]
    for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", lines[-1] if lines else ""):
        counts["failed" if word.startswith("error") else word] += int(n)  # an error fails its test
print(f"tests: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
EOF
for rc in "$others_rc" "$e2e_rc" "$cover_rc"; do
    [ "$rc" -eq 0 ] || exit "$rc"
done
