# Quick start: `make demo` runs the main job, `make test` runs every test.
# Both set everything up themselves on a fresh machine (a virtualenv in .venv;
# `make test` also installs the Debian packages the real-mount tests need).
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint system-deps clean generate check-generated wheel docs bench

# Tools of the packaging targets, installed on first use (kept out of `make test`'s set).
PACKAGE_TOOLS := $(VENV)/.package-tools

$(STAMP): pyproject.toml setup.py kubevol/metrics/_duwalk.c kubevol/mount/_mountinfo.c
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

$(PACKAGE_TOOLS): $(STAMP)
	$(BIN)/pip install -q -e '.[test,docs,package]'
	touch $@

demo: $(STAMP)
	$(BIN)/kubevol demo

system-deps:
	bash scripts/install-system-deps.sh

test: $(STAMP) system-deps
	bash scripts/run-tests.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy --strict kubevol tests benchmarks

generate: $(STAMP)
	bash scripts/generate-protos.sh

check-generated: $(STAMP)
	bash scripts/generate-protos.sh --check

# dist/kubevol-VERSION-cp311-abi3-manylinux_*.whl: one wheel for every supported Python,
# tagged by auditwheel with the oldest manylinux policy this machine's glibc allows.
wheel: $(PACKAGE_TOOLS)
	rm -rf dist build
	$(BIN)/python -m build --wheel --outdir dist/linux .
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/auditwheel repair --wheel-dir dist dist/linux/*.whl
	rm -rf dist/linux
	@ls dist/*.whl

# The API reference from the docstrings, into build/docs/ (every pdoc warning is an error).
docs: $(PACKAGE_TOOLS)
	rm -rf build/docs
	$(BIN)/python scripts/build-docs.py build/docs

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build dist

# Every benchmark against its reference, then one table (as root: real mounts).
bench: $(STAMP)
	$(BIN)/python -m benchmarks
