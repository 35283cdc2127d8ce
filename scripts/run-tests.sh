#!/usr/bin/env bash
# Runs the whole test suite. As root it runs inside a private mount namespace,
# so every mount a test makes disappears with the namespace even if the test
# is killed; tests still clean up after themselves. pytest's "no tests ran"
# (exit 5) is a failure, not a pass. The 15 slowest tests are listed at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
cmd=(.venv/bin/pytest -q -p no:cacheprovider --durations=15 "$@")
if [ "$(id -u)" -eq 0 ]; then
    cmd=(unshare -m --propagation private "${cmd[@]}")
fi
"${cmd[@]}"
rc=$?
if [ $rc -eq 5 ]; then
    echo "pytest collected no tests: that is a failure" >&2
    exit 1
fi
exit $rc
