# Two commands matter: `make demo` and `make test`. Both create or reuse .venv/ at the repo root.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.PHONY: demo test venv bench bench-sweep clean

$(BIN)/python:
	@command -v $(PY) >/dev/null 2>&1 || { echo "error: $(PY) not found; install Python 3.11 or run make PY=/path/to/python3.11" >&2; exit 1; }
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(PIP) install -q -c constraints.txt -e '.[test]'
	@rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/trajforge validate --dataset_file=examples/prompts.jsonl

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/throughput.py

bench-sweep: $(STAMP)
	$(BIN)/python bench/throughput.py --sweep

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
