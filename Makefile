# Set-up and entry points. Two commands do everything on a fresh machine:
#   make serve   install serving deps, build the default model if absent, run the decision service
#   make test    install everything the tests need, then lint (ruff), check the import order and the
#                types (import-linter, mypy: scripts/check_types.py) and run the suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/pip --disable-pip-version-check -q
HOST   ?= 127.0.0.1
PORT   ?= 8000

export MLFLOW_DISABLE_TELEMETRY := true
export ORT_DISABLE_TELEMETRY := 1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: serve test lint install install-train model bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(PIP) install -e .

# torch first, pinned to the CPU build on disk; otherwise pip pulls a CUDA build of several GB.
install-train: $(BIN)/python
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[train,test]'
	# xds-protos (ext_proc) overwrites files of opentelemetry-proto and common-expression-language
	# when pip installs it after them: reinstall those (scripts/fix_shadowed_packages.py says why)
	$(BIN)/python scripts/fix_shadowed_packages.py

# The default model ships in estimator/default_model/; rebuild it only when it is absent.
model:
	@if [ ! -f estimator/default_model/manifest.json ]; then \
	  echo "default model absent: building it (installs the train extra)"; \
	  $(MAKE) install-train && $(BIN)/pointsman train --output estimator/default_model --no-register; \
	fi

serve: install model
	$(BIN)/pointsman serve --host $(HOST) --port $(PORT)

lint: install-train
	$(BIN)/ruff check .
	$(BIN)/python scripts/check_types.py

test: lint
	$(BIN)/python -m pytest -q -n 2 --dist worksteal

clean:
	rm -rf $(VENV) build dist *.egg-info
