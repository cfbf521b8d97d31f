# The CPU build of torch 2.13.0 installs from a local wheel on the project machines; an unpinned
# torch would pull several GB of CUDA packages. pyproject.toml declares the range users need.
PYTHON ?= python3
TORCH_PIN ?= torch==2.13.0

.PHONY: install demo test test-slow lint bench

install:
	$(PYTHON) -m pip install --quiet $(TORCH_PIN)
	$(PYTHON) -m pip install --quiet -e ".[dev]"

# The demo's table compares against AutoETS and AutoTheta: the optional baselines extra (statsforecast).
demo: install
	$(PYTHON) -m pip install --quiet -e ".[baselines]"
	dpts fit --output-dir runs/demo --overwrite

# The fast suite on every core (pytest-xdist; PYTEST_WORKERS=0 runs it in one process). One thread per worker:
# the workers already use every core, and torch's own threads would only compete with them.
PYTEST_WORKERS ?= auto
PYTEST_XDIST = -n $(PYTEST_WORKERS) --dist loadfile

test: install
	$(PYTHON) -m ruff check lightning_dpts tests benchmarks examples
	OMP_NUM_THREADS=1 $(PYTHON) -m pytest $(PYTEST_XDIST) --durations=15

# The exhaustive statistical and end-to-end tests (marked slow; CI runs them after the fast suite), spread per test
# (work stealing): a few files hold most of the slow work.
# It also installs the baselines extra, so that the AutoETS/AutoTheta paths and the quickstart's table are tested.
test-slow: install
	$(PYTHON) -m pip install --quiet -e ".[dev,baselines]"
	OMP_NUM_THREADS=1 $(PYTHON) -m pytest -n $(PYTEST_WORKERS) --dist worksteal -m slow --durations=15

bench: install
	$(PYTHON) benchmarks/accountant.py
	$(PYTHON) benchmarks/datamodule.py
	$(PYTHON) benchmarks/dp_training.py
	$(PYTHON) benchmarks/epsilon_logging.py
