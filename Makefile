# Quick start: `make demo` runs the main job, `make test` runs every test.
# Both set everything up themselves on a fresh machine (a virtualenv in .venv: the runtime
# dependencies for `make demo`, the test tool-chain too for `make test`, which also
# installs the Debian packages the real-mount tests need).
VENV    := .venv
BIN     := $(VENV)/bin
RUNTIME := $(VENV)/.runtime
STAMP   := $(VENV)/.installed

.PHONY: demo test lint deadcode system-deps clean generate check-generated wheel docs bench

# Tools of the packaging targets, installed on first use (kept out of `make test`'s set).
PACKAGE_TOOLS := $(VENV)/.package-tools

# As root, commands that mount run in a private mount namespace (as scripts/run-tests.sh
# runs the tests): whatever a run killed with SIGKILL leaves mounted disappears with it.
PRIVATE_MOUNTS := $(if $(filter 0,$(shell id -u)),unshare -m --propagation private)

# Names each optional native core that was not built. setup.py says so while building, but
# pip shows a build backend's output only with -v (or when the build fails), so a quiet
# install would hide it: the installed package is asked instead.
NATIVE_CHECK := $(BIN)/python -c 'import importlib.util as u, sys; \
	off = [m for m in ("kubevol.metrics._duwalk", "kubevol.mount._mountinfo") if u.find_spec(m) is None]; \
	off and print("kubevol: not built (no working C compiler?):", ", ".join(off), \
	"- their Python twins run instead (slower); pip install -v . shows why", file=sys.stderr)'

# The runtime dependencies only: what `pip install kubevol` brings, all `make demo` needs.
$(RUNTIME): pyproject.toml setup.py kubevol/metrics/_duwalk.c kubevol/mount/_mountinfo.c
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	@$(NATIVE_CHECK)
	touch $@

$(STAMP): $(RUNTIME)
	$(BIN)/pip install -q -e '.[test]'
	touch $@

$(PACKAGE_TOOLS): $(STAMP)
	$(BIN)/pip install -q -e '.[test,docs,package]'
	touch $@

demo: $(RUNTIME)
	$(PRIVATE_MOUNTS) $(BIN)/kubevol demo

system-deps:
	bash scripts/install-system-deps.sh

test: $(STAMP) system-deps
	bash scripts/run-tests.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy --strict kubevol tests benchmarks

# Unused code in kubevol/ (vulture), less what deadcode-allowlist.py explains is not dead.
deadcode: $(STAMP)
	$(BIN)/vulture kubevol deadcode-allowlist.py --exclude kubevol/csi/_generated

generate: $(STAMP)
	bash scripts/generate-protos.sh

check-generated: $(STAMP)
	bash scripts/generate-protos.sh --check

# dist/kubevol-VERSION-cp311-abi3-manylinux_*.whl: one wheel for every supported Python,
# tagged by auditwheel with the oldest manylinux policy this machine's glibc allows.
# build/ is emptied of earlier builds (setuptools would reuse a stale build/lib), except
# build/docs/ that `make docs` writes.
wheel: $(PACKAGE_TOOLS)
	rm -rf dist
	if [ -d build ]; then find build -mindepth 1 -maxdepth 1 ! -name docs -exec rm -rf {} +; fi
	$(BIN)/python -m build --wheel --outdir dist/linux .
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/auditwheel repair --wheel-dir dist dist/linux/*.whl
	rm -rf dist/linux
	@ls dist/*.whl

# The API reference from the docstrings, into build/docs/ (every pdoc warning is an error).
docs: $(PACKAGE_TOOLS)
	rm -rf build/docs
	$(BIN)/python scripts/build-docs.py build/docs
	$(BIN)/python scripts/make-man.py build/man/kubevol.1

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build dist

# Every benchmark against its reference, then one table (as root: real mounts).
bench: $(STAMP)
	$(BIN)/python -m benchmarks
