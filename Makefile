# Convenience wrapper around CMake; the README's two set-up commands are
# `make run` and `make test`.  Each installs what is missing (scripts/deps.sh),
# Python packages into the virtual environment FM_VENV (default .venv/), whose
# python the tests then use (-DPython3_EXECUTABLE).
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
FM_VENV ?= $(CURDIR)/.venv
export FM_VENV
PY_FLAGS = -DPython3_EXECUTABLE=$(FM_VENV)/bin/python
# nvcc lives in /usr/local/cuda/bin on these machines, not always on PATH.
export PATH := $(PATH):/usr/local/cuda/bin

.PHONY: all deps build run test test-gpu test-asan test-tsan bench install clean

all: build

deps:
	@bash scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(PY_FLAGS) $(CMAKE_FLAGS) >/dev/null
	@MAKEFLAGS=--no-print-directory cmake --build $(BUILD) -j $(JOBS)

# The main job: a GLM-5 EP8-shaped NVFP4 MoE layer on the best backend present
# (CUDA if there is a GPU, else the fast CPU path), checked against the reference.
run: build
	./$(BUILD)/fp4moe run --check

# CPU tests (GPU tests are labelled "gpu" and skip without a device).
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-gpu: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

# The CPU tests again under AddressSanitizer + UndefinedBehaviorSanitizer.  The
# fuzz tests (label "fuzz") are left out here: fuzz/run.sh builds its targets with
# ASan+UBSan itself, and `make test` has run them.
test-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DFM_SANITIZE=ON -DFM_WITH_CUDA=OFF \
	    -DFM_BUILD_BENCH=OFF $(PY_FLAGS) $(CMAKE_FLAGS) >/dev/null
	@MAKEFLAGS=--no-print-directory cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    FM_ASAN=1 ctest --output-on-failure -j $(JOBS) -L cpu -LE fuzz

# The threading tests under ThreadSanitizer: one layer from two threads (include/fp4moe/layer.h,
# "Threads"; tests/test_layer_threads.c). Only that program is built (the library with it).
# OMP_NUM_THREADS=1: libgomp is not built with TSan, so its own barriers read as races; with one
# OpenMP thread per call the threads that run at once are the test's, which is what it checks.
# FM_ASAN=1: the small layer sizes of the sanitizer runs.
test-tsan: deps
	@cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DFM_WITH_CUDA=OFF -DFM_BUILD_BENCH=OFF -DFM_PYTHON=OFF \
	    "-DCMAKE_C_FLAGS=-fsanitize=thread -fno-omit-frame-pointer" -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
	    $(PY_FLAGS) $(CMAKE_FLAGS) >/dev/null
	@MAKEFLAGS=--no-print-directory cmake --build $(TSAN_BUILD) -j $(JOBS) --target test_layer_threads
	cd $(TSAN_BUILD) && OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 FM_ASAN=1 ctest --output-on-failure -R '^test_layer_threads$$'

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
