# tpde: every target creates .venv when it is missing and installs what it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test
# make test runs the default tier in PYTEST_WORKERS processes (pytest-xdist; 0: in one), one
# numba thread each: on cores shared with other jobs, numba's threads wait for each other at
# every parallel loop (the tier took 28 minutes on a busy 2-core machine with two threads)
PYTEST_WORKERS ?= 2
# installs say only what fails: pip's and setuptools' notices about this machine's package
# indexes and the editable layout are not the user's business (errors still print)
PIP    := PYTHONWARNINGS=ignore $(PY) -m pip --quiet --quiet

.PHONY: demo test test-cpu test-slow validate bench paper lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PIP) install -e .
	touch $(STAMP)

$(TSTAMP): $(STAMP)
	$(PIP) install -e '.[test]'
	touch $(TSTAMP)

demo: $(STAMP)
	mkdir -p out
	$(VENV)/bin/tpde run examples/e2_collapse_to_line.toml -o out/e2_collapse_to_line.nc --overwrite
	$(VENV)/bin/tpde plot out/e2_collapse_to_line.nc -o out/e2_figures

test: $(TSTAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) tools/typecheck.py
	TPDE_NUM_THREADS=1 $(PY) -m pytest -q -n $(PYTEST_WORKERS)

# the default tier with the CPU seconds of every test (tools/cputime_plugin.py) written to
# CPU_OUT, then its tables (tools/cpu_table.py): CPU seconds do not grow with other jobs' load
CPU_OUT ?= out/test-cpu.jsonl
test-cpu: $(TSTAMP)
	mkdir -p $(dir $(CPU_OUT))
	rm -f $(CPU_OUT)
	CPUTIME_OUT=$(abspath $(CPU_OUT)) TPDE_NUM_THREADS=1 $(PY) -m pytest -q -n $(PYTEST_WORKERS) -p tools.cputime_plugin
	$(PY) tools/cpu_table.py $(CPU_OUT)

test-slow: $(TSTAMP)
	$(PY) -m pytest -q -m slow -s

validate: $(STAMP)
	$(VENV)/bin/tpde validate --suite quick -o out/validation

paper: $(STAMP)
	$(PY) examples/paper/run_paper.py -o out/paper

bench: $(STAMP)
	bash benchmarks/setup_peers.sh
	$(PY) benchmarks/run_all.py

lint: $(TSTAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) tools/typecheck.py

clean:
	rm -rf $(VENV) out build *.egg-info
