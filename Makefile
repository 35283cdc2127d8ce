# Quick start: `make demo` runs the main job, `make test` runs every test.
# Both set everything up themselves on a fresh machine (a virtualenv in .venv;
# `make test` also installs the Debian packages the real-mount tests need).
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint system-deps clean generate check-generated

$(STAMP): pyproject.toml kubevol/metrics/_duwalk.c kubevol/mount/_mountinfo.c
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
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

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
