# The only entry points of the series. Each target installs what it needs first, into .venv,
# and skips the install when pyproject.toml has not changed since the last one.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Notebooks are committed executed under the small `ci` profile, one thread, so that nbval
# re-executing them anywhere reproduces the committed outputs.
NOTEBOOK_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 GRADACCUM_PROFILE=ci
LAB_PORT ?= 8888

.PHONY: setup lab test test-browser notebooks lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --port=$(LAB_PORT) --no-browser \
		$$( [ "$$(id -u)" = 0 ] && echo --allow-root )

test: $(STAMP)
	$(NOTEBOOK_ENV) $(PY) -m pytest tests notebooks -m "not browser" --nbval \
		--nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
		--nbval-cell-timeout=600

# JupyterLab in Chromium (/usr/bin/chromium; Debian: apt-get install chromium): the sliders
test-browser: $(STAMP)
	$(NOTEBOOK_ENV) $(PY) -m pytest tests/browser -m browser -v

notebooks: $(STAMP)
	$(NOTEBOOK_ENV) $(PY) scripts/execute_notebooks.py notebooks/*.ipynb

bench: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) benchmarks/run.py

lint: $(STAMP)
	$(VENV)/bin/ruff check gradaccum_lib tests scripts benchmarks notebooks conftest.py

clean:
	rm -rf $(VENV) *.egg-info
