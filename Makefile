# The CPU build of torch 2.13.0 installs from a local wheel on the project machines; an unpinned
# torch would pull several GB of CUDA packages. pyproject.toml declares the range users need.
PYTHON ?= python3
TORCH_PIN ?= torch==2.13.0

.PHONY: install demo test lint bench

install:
	$(PYTHON) -m pip install --quiet $(TORCH_PIN)
	$(PYTHON) -m pip install --quiet -e ".[dev]"

demo: install
	dpts fit --output-dir runs/demo --overwrite

test: install
	$(PYTHON) -m ruff check lightning_dpts tests benchmarks examples
	$(PYTHON) -m pytest

bench: install
	$(PYTHON) benchmarks/accountant.py
	$(PYTHON) benchmarks/datamodule.py
	$(PYTHON) benchmarks/dp_training.py
	$(PYTHON) benchmarks/epsilon_logging.py
