#!/usr/bin/env bash
# CI's packaging checks, each of which fails if what it checks regresses:
#   1. `make wheel` gives one cp311-abi3 manylinux wheel, which installs into fresh venvs of
#      the oldest (3.11) and newest (3.13) supported Pythons and runs from outside the source
#      tree: `kubevol --help`, `kubevol plugins`, `kubevol demo` (as root), the native walker;
#   2. without a C compiler the package still builds, says the native walker is off, and
#      `kubevol metrics` then says the Python walker ran;
#   3. the protobuf bounds: the lowest allowed protobuf and the newest release both run the
#      CSI client and CLI tests;
#   4. a downstream project's mypy sees kubevol's types through `pip install -e`;
#   5. the whole test suite on the newest supported Python.
# Run as root on a fresh machine (after `make test`); takes a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
BIN=$REPO/.venv/bin
WORK=$(mktemp -d /tmp/kubevol-package-XXXXXX)
chmod 755 "$WORK"  # tests run some commands as user nobody
trap 'rm -rf "$WORK"' EXIT
LOWEST_PROTOBUF=5.28.1  # pyproject.toml's lower bound

say() { printf '\n== check-package: %s\n' "$*"; }

# python_for VERSION: an interpreter of that version: on PATH, else a pyenv build of it
# (Debian 12 packages only 3.11). Fails when there is none: the check must not pass silently.
python_for() {
    local exe
    if exe=$(command -v "python$1") && "$exe" -c pass 2>/dev/null; then echo "$exe"; return; fi
    for exe in "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/"$1".*/bin/"python$1"; do
        if [ -x "$exe" ]; then echo "$exe"; return; fi
    done
    echo "check-package: no Python $1 here (not on PATH, not in pyenv)" >&2
    return 1
}

# smoke VENV: the installed command, run from a directory without the source tree.
smoke() {
    local venv=$1
    (
        cd "$WORK"
        "$venv/bin/python" -c 'import kubevol; assert "site-packages" in kubevol.__file__, kubevol.__file__'
        "$venv/bin/python" -c 'import kubevol.metrics._duwalk, kubevol.mount._mountinfo'  # abi3 loads
        "$venv/bin/kubevol" --help >/dev/null
        "$venv/bin/kubevol" plugins
        "$venv/bin/kubevol" metrics -o wide "$WORK" | tee "$WORK/metrics.txt"
        grep -q 'walk (native)' "$WORK/metrics.txt"
        unshare -m --propagation private "$venv/bin/kubevol" demo >"$WORK/demo.txt" \
            || { cat "$WORK/demo.txt"; exit 1; }
        tail -1 "$WORK/demo.txt"
    )
}

say "make wheel"
make wheel
WHEEL=$(ls "$REPO"/dist/kubevol-*-cp311-abi3-manylinux_*_x86_64.whl)
echo "$WHEEL"

PY311=$(python_for 3.11)
PY313=$(python_for 3.13)
for py in "$PY311" "$PY313"; do
    say "the wheel on $("$py" --version) in a fresh venv, outside the source tree"
    venv=$WORK/venv-$(basename "$py")
    "$py" -m venv "$venv"
    "$venv/bin/pip" install -q "$WHEEL"
    smoke "$venv"
done

say "a build without a C compiler"
nocc=$WORK/nocc
mkdir "$nocc"
git -C "$REPO" archive HEAD | tar -x -C "$nocc"
(cd "$nocc" && CC=/bin/false "$BIN/python" -m build --wheel --outdir "$nocc/dist" . \
    >"$WORK/nocc.log" 2>&1) || { cat "$WORK/nocc.log"; exit 1; }
grep 'the native du walker is off' "$WORK/nocc.log"
"$PY311" -m venv "$WORK/venv-nocc"
"$WORK/venv-nocc/bin/pip" install -q "$nocc"/dist/*.whl
"$WORK/venv-nocc/bin/kubevol" metrics -o wide "$WORK" | tee "$WORK/metrics.txt"
grep -q 'walk (python)' "$WORK/metrics.txt"

for protobuf in "$LOWEST_PROTOBUF" newest; do
    say "protobuf $protobuf: the CSI client, middleware (descriptors, redaction) and CLI tests"
    venv=$WORK/venv-protobuf-$protobuf
    "$PY311" -m venv "$venv"
    "$venv/bin/pip" install -q "$WHEEL" pytest hypothesis
    if [ "$protobuf" = newest ]; then
        "$venv/bin/pip" install -q --upgrade protobuf
    else
        "$venv/bin/pip" install -q "protobuf==$protobuf"
    fi
    "$venv/bin/python" -c 'import google.protobuf as p; print("protobuf", p.__version__)'
    unshare -m --propagation private "$venv/bin/pytest" -q -p no:cacheprovider \
        tests/csi/test_client.py tests/csidriver/test_middleware.py tests/cli/test_csi_cli.py
done

say "a downstream project's mypy sees kubevol's types (editable install)"
mkdir "$WORK/downstream"
cat >"$WORK/downstream/app.py" <<'EOF'
import kubevol

spec: int = kubevol.Spec.from_manifest("name: x\nemptyDir: {}\n")
EOF
(cd "$WORK/downstream" && "$BIN/mypy" --strict --cache-dir "$REPO/.mypy_cache" app.py \
    >"$WORK/mypy.txt" 2>&1) || true
cat "$WORK/mypy.txt"
grep -q 'Incompatible types in assignment (expression has type "Spec"' "$WORK/mypy.txt"

say "the test suite on $("$PY313" --version)"
"$PY313" -m venv "$WORK/venv-313-tests"
"$WORK/venv-313-tests/bin/pip" install -q -e ".[test]"
cmd=("$WORK/venv-313-tests/bin/pytest" -q -p no:cacheprovider)
# One test runs kubevol as user nobody: that needs an interpreter nobody may run (a pyenv
# build under a private /root is not one; Debian's python3.11 is).
if ! setpriv --reuid=65534 --regid=65534 --clear-groups "$PY313" -c pass 2>/dev/null; then
    echo "check-package: user nobody cannot run $PY313: the privilege-error test runs on 3.11 only"
    cmd+=(--deselect tests/cli/test_node_cli.py::test_privilege_errors_say_what_is_missing_and_how_to_run)
fi
[ "$(id -u)" -eq 0 ] && cmd=(unshare -m --propagation private "${cmd[@]}")
"${cmd[@]}"
# The editable install above rebuilt the extensions in place (same abi3 files): put the
# main venv's install back, so that later commands run what `make` built.
"$BIN/pip" install -q --no-deps -e .

say "every packaging check passed"
