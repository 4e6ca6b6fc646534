# quantcore: every target is self-contained on a fresh machine (it makes the
# venv and installs what it needs from the package registries).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
SOURCES := setup.py pyproject.toml $(wildcard quantcore/_cpu/*.pyx quantcore/_cpu/*.pxd quantcore/include/*.h)
PYTEST_ARGS ?=

.PHONY: all venv install demo test bench bench-summary asan-test gpu-test clean

all: test

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install "setuptools>=64" "Cython>=3.0" "numpy>=2.0" wheel
	touch $@

venv: $(VENV)/.created

# Editable install with the test extras; rebuilt when a C/Cython source changes.
$(VENV)/.installed: $(VENV)/.created $(SOURCES)
	$(PIP) install --no-build-isolation -e ".[test,torch]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) -m quantcore demo

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: install
	$(PIP) install matplotlib
	$(PY) -m pytest bench -q --benchmark-only --benchmark-json=bench/results/latest.json $(PYTEST_ARGS)
	$(PY) bench/summary.py bench/results/latest.json

clean:
	rm -rf build *.egg-info quantcore/_cpu/*.so quantcore/_cpu/*.c $(VENV)
