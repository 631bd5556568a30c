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
# JupyterLab's own defaults for this venv's Lab only (jupyter/lab-overrides.json: no "receive
# official Jupyter news?" pop-up). Lab reads <sys.prefix>/share/jupyter/lab/settings/
# overrides.d/*.json; the user's settings (~/.jupyter) are not touched and still win.
LAB_SETTINGS ?= $(VENV)/share/jupyter/lab/settings
LAB_OVERRIDES := $(LAB_SETTINGS)/overrides.d/gradaccum.json

.PHONY: setup lab lab-settings test test-browser notebooks lint bench gpu-check clean doctor site check-profiles \
	check-portability conformance

setup: $(STAMP)

# PyTorch's build. PyPI's torch is, on Linux, the CUDA build (several GB, useless without an
# NVIDIA GPU), so where no NVIDIA GPU answers, torch comes from PyTorch's CPU index first (a
# 192 MB wheel; 2.13.0+cpu satisfies the ==2.13.0 pin). TORCH_INDEX=<index URL> picks another
# build (e.g. https://download.pytorch.org/whl/cu128); TORCH_INDEX= takes PyPI's. An installed
# torch is kept.
TORCH_PIN := $(shell sed -n 's/^ *"\(torch==[^"]*\)",$$/\1/p' pyproject.toml)
TORCH_INDEX ?= $(shell nvidia-smi -L >/dev/null 2>&1 || echo https://download.pytorch.org/whl/cpu)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if [ -n "$(TORCH_INDEX)" ] && ! $(PY) -c "import torch" 2>/dev/null; then \
		echo "installing $(TORCH_PIN) from $(TORCH_INDEX)"; \
		$(PY) -m pip install --quiet --disable-pip-version-check --retries 1 --timeout 30 \
			'$(TORCH_PIN)' --extra-index-url $(TORCH_INDEX); fi
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

# The notebooks are trusted first (signatures go to Jupyter's local database, the files are not
# written), so that JupyterLab draws their stored widgets before anything runs. The profile is
# the committed outputs' (`ci`) unless GRADACCUM_PROFILE says otherwise.
# Lab opens where the series starts, notebook 00: the Chinese twin where the locale is Chinese
# (LANG or LC_ALL zh_*); LAB_START=<a path under notebooks/> opens another page.
LAB_START ?= $(if $(filter zh%,$(LC_ALL) $(LANG)),zh/00_the_article.zh.ipynb,00_the_article.ipynb)

lab: $(STAMP) $(LAB_OVERRIDES)
	@$(VENV)/bin/jupyter trust notebooks/*.ipynb notebooks/zh/*.ipynb
	@profile="$${GRADACCUM_PROFILE:-ci}"; echo "make lab: GRADACCUM_PROFILE=$$profile" \
		"(ci = the committed outputs' sizes; GRADACCUM_PROFILE=cpu|gpu make lab for others)"
	GRADACCUM_PROFILE="$${GRADACCUM_PROFILE:-ci}" $(VENV)/bin/jupyter lab \
		--notebook-dir=notebooks --port=$(LAB_PORT) --no-browser \
		--LabApp.default_url=/lab/tree/$(LAB_START) \
		$$( [ "$$(id -u)" = 0 ] && echo --allow-root )

lab-settings: $(LAB_OVERRIDES)

$(LAB_OVERRIDES): jupyter/lab-overrides.json
	@mkdir -p $(@D) && cp $< $@

# What is set up and what is missing, one line per check (no install: it runs before one too)
doctor:
	@LAB_PORT=$(LAB_PORT) $$( [ -x $(PY) ] && echo $(PY) || echo $(PYTHON) ) scripts/doctor.py

# A static HTML edition in build/site/: the notebooks (outputs and widget state embedded), their
# solutions, the README and the docs/*.md pages, linked from index.html (docs/site.md)
site: $(STAMP)
	$(PY) scripts/build_site.py --out build/site

# pytest-xdist: TEST_WORKERS processes (2: CI's cores; TEST_WORKERS=auto on a bigger machine,
# 0 for one process). --dist loadfile keeps each file on one worker: a notebook's cells run in
# order in one kernel, and a test file's module fixtures are built once.
TEST_WORKERS ?= 2
# nbval: every notebook's outputs compared with the committed ones, after the sanitizing regexes
NBVAL_FLAGS := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
	--nbval-cell-timeout=600

# Unit tests and every notebook and solution under nbval: about 10 min on 2 cores. CI (.ci/run)
# runs this, then test-browser.
test: $(STAMP)
	$(NOTEBOOK_ENV) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile tests notebooks \
		-m "not browser" $(NBVAL_FLAGS)

# The committed outputs compared under another CPU math path: ATen's portable kernels, MKL held
# to SSE4.2 (what another CPU's vendor code path or an ARM laptop without MKL may print; MKL's
# reproducible mode, MKL_CBWR, is deliberately not set anywhere). Not in `make test`: 5-8 min.
OTHER_MATH_PATH := ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2

check-portability: $(STAMP)
	$(OTHER_MATH_PATH) $(NOTEBOOK_ENV) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile \
		notebooks $(NBVAL_FLAGS)

# JupyterLab in Chromium (/usr/bin/chromium; Debian: apt-get install chromium): the sliders.
# --dist loadfile: the sliders' file on one worker, the site's on the other (one build each of
# JupyterLab and of the site: two workers fetching build/site-vendor/ at once would race).
test-browser: $(STAMP)
	$(NOTEBOOK_ENV) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile tests/browser -m browser -v

# ... then the Chinese twins (notebooks/zh/) take the new outputs: scripts/build_twins.py
notebooks: $(STAMP)
	$(NOTEBOOK_ENV) $(PY) scripts/execute_notebooks.py notebooks/*.ipynb notebooks/solutions/*.ipynb
	$(PY) scripts/build_twins.py

# Every notebook executed under the laptop sizes, outputs not compared, nothing written: each
# must run top to bottom with its asserts holding at those sizes too (not in `make test`: long)
check-profiles: $(STAMP)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 GRADACCUM_PROFILE=cpu $(PY) scripts/execute_notebooks.py \
		--check notebooks/*.ipynb notebooks/solutions/*.ipynb

# The conformance table (issue 50): each framework's accumulation path x each scenario against
# the ground truth: docs/conformance/ (JSON, heat-map) and the pages docs/conformance.md and
# docs/zh/conformance.md (about 65 s), then every cell asserted at the pinned versions and each
# deviation's program run (tests/test_conformance.py in full: about 3.5 min in all on 2 cores)
conformance: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m gradaccum_course.audits.conformance --out docs/conformance
	GRADACCUM_CONFORMANCE_FULL=1 OMP_NUM_THREADS=1 $(PY) -m pytest -q tests/test_conformance.py

bench: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) benchmarks/run.py

# on a machine with an NVIDIA GPU: the CUDA numbers (benchmarks/results-gpu.json, README-gpu.md)
gpu-check: $(STAMP)
	$(PY) scripts/gpu_check.py

lint: $(STAMP)
	$(VENV)/bin/ruff check gradaccum_lib tests scripts benchmarks notebooks conftest.py

clean:
	rm -rf $(VENV) *.egg-info
