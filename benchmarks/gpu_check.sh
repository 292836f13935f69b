#!/usr/bin/env bash
# The prepared check for a lent GPU machine (no internet there: it uses the Python, torch,
# CMake, ninja, scikit-build-core and pybind11 already installed). It builds the extension
# from source for the local GPU, runs the CUDA tests and the GPU benchmarks, and writes one
# JSON report plus logs into $OUT (or ./bench-results). Sized to finish in under 8 minutes.
#
#   bash benchmarks/gpu_check.sh
#
# The CUTLASS/CuTe headers of the Hopper kernel come from the nvidia-cutlass wheel; where pip
# cannot reach an index, put the wheel in .whl/ first:
#   pip download --no-deps nvidia-cutlass==4.2.0.0 -d .whl
set -uo pipefail
cd "$(dirname "$0")/.."
out_dir=${OUT:-bench-results}
mkdir -p "$out_dir"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
export CUDACXX=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
arch=$($py -c "import torch; m, n = torch.cuda.get_device_capability(); print(f'{m}{n}a' if m >= 9 else f'{m}{n}')")

echo "== build for sm_$arch"
start=$(date +%s)
site=$(mktemp -d)
if ! $py -c "import importlib.util as u, sys; sys.exit(u.find_spec('cutlass_library') is None)"; then
  deps=$(mktemp -d)
  if ls .whl/nvidia_cutlass-*.whl > /dev/null 2>&1; then
    $py -m pip install -q --no-index --no-deps --target "$deps" .whl/nvidia_cutlass-*.whl
  else
    $py -m pip install -q --no-deps --target "$deps" nvidia-cutlass==4.2.0.0 \
      || echo "no CUTLASS headers: the sm_90a wgmma kernel will not be built"
  fi
  export PYTHONPATH=$deps${PYTHONPATH:+:$PYTHONPATH}
fi
$py -m pip install -q --no-build-isolation --no-deps --target "$site" . \
  -Ccmake.define.EAGLE3_REQUIRE_CUDA=ON "-Ccmake.define.EAGLE3_CUDA_ARCHS=$arch" \
  > "$out_dir/build.log" 2>&1 || { tail -50 "$out_dir/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
$py -c "import eagle3_ext, json; print(json.dumps(eagle3_ext.build_info()))" | tee "$out_dir/build_info.json"

echo "== CUDA tests"
$py -m pytest -q -m cuda -p no:cacheprovider tests --junitxml "$out_dir/cuda_tests.xml" 2>&1 \
  | tee "$out_dir/cuda_tests.log" | tail -25
tests_rc=${PIPESTATUS[0]}

echo "== benchmarks"
$py benchmarks/bench_fused_aux_fc.py --device cuda --dtype bf16 --budget 0.3 \
  --out "$out_dir/fused_aux_fc_cuda.json"
bench_rc=$?
$py benchmarks/bench_tree_ops.py --device cuda --budget 0.2 --reference-bs 2 \
  --out "$out_dir/tree_ops_cuda.json" || bench_rc=1
$py benchmarks/bench_tree_attention.py --device cuda --dtype bf16 --budget 0.2 \
  --prefix 1024 16384 --tree 8 64 --batch 1 32 --out "$out_dir/tree_attention_cuda.json" \
  || bench_rc=$?
$py benchmarks/bench_tree_attention.py --device cuda --dtype bf16 --budget 0.2 --paged 16 \
  --prefix 4096 --tree 32 --batch 8 --out "$out_dir/tree_attention_paged_cuda.json" || bench_rc=$?
# The native binary, without Python in the loop; it finds libtorch next to the installed torch.
export LD_LIBRARY_PATH=$($py -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for preset in decode-8b prefill-8b decode-70b; do
  "$site/eagle3_ext/bin/eagle3_bench" --device cuda --preset "$preset" --repeat 20 \
    --json "$out_dir/native_${preset}_cuda.json" || bench_rc=1
done

$py - "$out_dir" "$tests_rc" <<'PY'
import json, os, sys
out, tests_rc = sys.argv[1], int(sys.argv[2])
report = {"cuda_tests_exit_code": tests_rc, "benchmarks": {}}
for name in sorted(os.listdir(out)):
    if name.endswith("_cuda.json"):
        with open(os.path.join(out, name)) as f:
            report["benchmarks"][name[:-5]] = json.load(f)
with open(os.path.join(out, "gpu_report.json"), "w") as f:
    json.dump(report, f, indent=2)
print("wrote", os.path.join(out, "gpu_report.json"))
PY
exit $(( tests_rc != 0 || bench_rc != 0 ))
