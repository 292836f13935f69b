#!/usr/bin/env bash
# The prepared check for a lent GPU machine, which has no internet: it checks its prerequisites,
# installs missing Python packages from a wheelhouse, builds the extension from source for the
# local GPU, runs the CUDA tests, one test per op under compute-sanitizer, the GPU benchmarks and
# eagle3_bench's presets, and writes one JSON report (gpu_report.json) plus a log per step into
# $OUT (or ./bench-results). Every step is time-boxed; the whole run stays under 8 minutes.
#
#   bash benchmarks/gpu_check.sh [--check-only]
#
# --check-only (or EAGLE3_GPU_CHECK_ONLY=1): check the prerequisites only, print what is missing
# and exit 1 if anything is that the wheelhouse cannot provide, else 0.
# Wheelhouse: .whl/ (EAGLE3_WHEELHOUSE), filled by benchmarks/prepare_wheelhouse.sh on a machine
# with internet; it must hold nvidia-cutlass, the rest only where the GPU machine lacks it.
# PYTHON: the interpreter (python3). EAGLE3_CUDA_ARCHS: build for these instead of the local GPU;
# without a visible GPU this rehearses the run: the build happens, the GPU steps are skipped.
# EAGLE3_BUILD_DIR: the CMake build directory (build/gpucheck); EAGLE3_BUILD_TIMEOUT_S: the
# build's time box (300 s); EAGLE3_GPU_CHECK_BUDGET_S: the whole run's (470 s).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
check_only=${EAGLE3_GPU_CHECK_ONLY:-0}
for arg in "$@"; do
  case $arg in
    --check-only) check_only=1 ;;
    -h|--help) sed -n '2,18p' "$0" | cut -c3-; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done
out_dir=${OUT:-bench-results}
mkdir -p "$out_dir"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
support=benchmarks/gpu_check_support.py
wheelhouse=${EAGLE3_WHEELHOUSE:-.whl}
budget=${EAGLE3_GPU_CHECK_BUDGET_S:-470}
start_all=$SECONDS
trap '[[ -z ${deps:-}${site:-} ]] || rm -rf "${deps:-}" "${site:-}"' EXIT  # the install directories made below
if ! command -v "$py" > /dev/null; then
  echo "missing: $py (set PYTHON to the interpreter that has torch)"
  exit 1
fi

# Each step appends: name, status (ok|failed|timeout|skipped), exit code, seconds, log, note.
: > "$out_dir/steps.tsv"
record() {
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "${6:-}" >> "$out_dir/steps.tsv"
  echo "== $1: $2 ($4 s)${6:+: $6}"
}
skip() { record "$1" skipped 0 0 "" "$2"; }
time_left() { echo $(( budget - (SECONDS - start_all) )); }
# step NAME CAP_S LOG CMD...: CMD under `timeout` (CAP_S or the run's time left, the smaller),
# output to $out_dir/LOG; prints the log's last line, or its tail when the step failed.
step() {
  local name=$1 cap=$2 log=$3 limit rc status begin=$SECONDS
  shift 3
  limit=$(time_left)
  (( cap < limit )) && limit=$cap
  if (( limit < 5 )); then skip "$name" "out of time"; return 1; fi
  timeout -k 10 "$limit" "$@" > "$out_dir/$log" 2>&1
  rc=$?
  case $rc in 0) status=ok ;; 124|137) status=timeout ;; *) status=failed ;; esac
  record "$name" "$status" "$rc" $(( SECONDS - begin )) "$log" "$(tail -1 "$out_dir/$log" | tr '\t' ' ' | cut -c1-200)"
  (( rc == 0 )) || tail -20 "$out_dir/$log"
  return "$rc"
}
finish() {
  printf 'rehearsal\t%s\narchs\t%s\ntotal_seconds\t%s\n' "${rehearsal:-0}" "${BUILD_ARCHS:-}" \
    $(( SECONDS - start_all )) > "$out_dir/run.tsv"
  echo "report: $("$py" "$support" report "$out_dir")"
  if awk -F'\t' '$2 == "failed" || $2 == "timeout" { bad = 1 } END { exit !bad }' "$out_dir/steps.tsv"; then
    exit 1
  fi
  exit "${1:-0}"
}

# 1. Prerequisites. With EAGLE3_CUDA_ARCHS set, a missing GPU (and what only the GPU steps use)
# does not stop the run: that is the rehearsal on a machine without one.
prereq_args=(--wheelhouse "$wheelhouse" --json "$out_dir/prereqs.json" --env "$out_dir/prereqs.env")
[[ $check_only == 0 && -n ${EAGLE3_CUDA_ARCHS:-} ]] && prereq_args+=(--rehearsal)
step prerequisites 60 prereqs.log "$py" "$support" prereqs "${prereq_args[@]}" > /dev/null
rc=$?
cat "$out_dir/prereqs.log"
if [[ $check_only == 1 ]]; then exit $(( rc != 0 )); fi
(( rc == 0 )) || finish 1
# shellcheck source=/dev/null
source "$out_dir/prereqs.env"
rehearsal=$(( GPU_VISIBLE == 0 ))

# 2. Missing Python packages (cmake and ninja too) from the wheelhouse, never from an index,
# into a directory of their own put first on PYTHONPATH and PATH; then the same check again.
if [[ -n $INSTALL_DEPS$INSTALL_NO_DEPS ]]; then
  deps=$(mktemp -d)
  export PYTHONPATH=$deps${PYTHONPATH:+:$PYTHONPATH} PATH=$deps/bin:$PATH
  pip_install=("$py" -m pip install -q --disable-pip-version-check --no-warn-conflicts --no-index
               --find-links "$wheelhouse" --target "$deps" --upgrade)
  read -r -a wanted <<< "$INSTALL_DEPS"
  read -r -a wanted_alone <<< "$INSTALL_NO_DEPS"
  : > "$out_dir/installed.tsv"
  if (( ${#wanted[@]} )) && step install 120 install.log "${pip_install[@]}" "${wanted[@]}"; then
    printf '%s\tok\n' "${wanted[@]}" >> "$out_dir/installed.tsv"
  fi
  if (( ${#wanted_alone[@]} )) && step install_no_deps 60 install_no_deps.log \
      "${pip_install[@]}" --no-deps "${wanted_alone[@]}"; then
    printf '%s\tok\n' "${wanted_alone[@]}" >> "$out_dir/installed.tsv"
  fi
  echo "installed from $wheelhouse: $(cut -f1 "$out_dir/installed.tsv" | paste -sd' ')"
  prereq_args=(--wheelhouse /nonexistent --json "$out_dir/prereqs_after_install.json" --env "$out_dir/prereqs.env")
  [[ -n ${EAGLE3_CUDA_ARCHS:-} ]] && prereq_args+=(--rehearsal)
  step prerequisites_after_install 60 prereqs_after_install.log "$py" "$support" prereqs "${prereq_args[@]}"
  rc=$?
  grep -E '^(missing|rehearsal):' "$out_dir/prereqs_after_install.log"
  (( rc == 0 )) || finish 1
  # shellcheck source=/dev/null
  source "$out_dir/prereqs.env"
fi
export CUDACXX

# 3. Build for the local GPU (or EAGLE3_CUDA_ARCHS) into a throwaway install directory.
site=$(mktemp -d)
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
step build "${EAGLE3_BUILD_TIMEOUT_S:-300}" build.log "$py" -m pip install -v --disable-pip-version-check \
  --no-build-isolation --no-deps --target "$site" . \
  -Ccmake.define.EAGLE3_REQUIRE_CUDA=ON "-Ccmake.define.EAGLE3_CUDA_ARCHS=$BUILD_ARCHS" \
  "-Cbuild-dir=${EAGLE3_BUILD_DIR:-build/gpucheck}"
built=$?
if (( built == 0 )); then
  # The CUDA kernels must be in, and on sm_90a the wgmma kernel (CUTLASS was a prerequisite).
  step build_info 60 build_info.log "$py" -c "
import json, sys, eagle3_ext
info = eagle3_ext.build_info()
json.dump(info, open(sys.argv[1], 'w'), indent=2)
print(info)
sys.exit(not info['cuda_compiled'] or ('90a' in info['cuda_archs'] and not info['sm90_wgmma']))" \
    "$out_dir/build_info.json"
  built=$?
fi
# eagle3_bench's RUNPATH names torch/lib only; the CUDA runtime torch came with lies elsewhere.
native_env=(env "LD_LIBRARY_PATH=${CUDART_DIRS:+$CUDART_DIRS:}$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
native=$site/eagle3_ext/bin/eagle3_bench
read -r -a test_files <<< "$("$py" "$support" cuda-test-files)"
if (( built == 0 )); then
  step native_bench_loads 30 native_help.log "${native_env[@]}" "$native" --help
  step cuda_tests_collect 60 cuda_tests_collect.log "$py" -m pytest -q --collect-only -m cuda -p no:cacheprovider \
    "${test_files[@]}"
fi

gpu_steps=(cuda_tests sanitizer bench_fused_aux_fc bench_tree_ops bench_tree_attention bench_tree_attention_paged
           native_decode-8b native_prefill-8b native_decode-70b)
if (( built != 0 || rehearsal )); then
  why="build failed"
  (( built == 0 )) && why="no GPU visible (rehearsal)"
  for name in "${gpu_steps[@]}"; do skip "$name" "$why"; done
  finish
fi

# 4. One small test per op under compute-sanitizer, each run in its own process and all of them
# in the background while the CUDA tests run (both only check correctness, not speed).
sanitize() {
  local op tool nodes_text begin rc status
  local -a nodes
  while IFS=$'\t' read -r op tool nodes_text; do
    read -r -a nodes <<< "$nodes_text"
    (
      begin=$SECONDS
      timeout -k 10 "$1" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$COMPUTE_SANITIZER" --tool "$tool" \
        --error-exitcode 1 "$py" -m pytest -q -p no:cacheprovider "${nodes[@]}" \
        > "$out_dir/sanitizer_${op}_${tool}.log" 2>&1
      rc=$?
      case $rc in 0) status=ok ;; 124|137) status=timeout ;; *) status=failed ;; esac
      printf '%s\t%s\t%s\t%s\t%s\n' "$op" "$tool" "$status" $(( SECONDS - begin )) "sanitizer_${op}_${tool}.log" \
        >> "$out_dir/sanitizer.tsv"
    ) &
  done < <("$py" "$support" sanitizer-runs)
  wait
}
: > "$out_dir/sanitizer.tsv"
sanitizer_limit=$(time_left)
(( sanitizer_limit > 200 )) && sanitizer_limit=200
(( sanitizer_limit < 5 )) && sanitizer_limit=5
sanitizer_begin=$SECONDS
sanitize "$sanitizer_limit" &
sanitizer_pid=$!

# (260 s: the compiled generator's CUDA-graph test compiles a few graphs with Triton)
step cuda_tests 260 cuda_tests.log env EAGLE3_EXPECT_CUDA=1 "$py" -m pytest -q -m cuda -p no:cacheprovider \
  "${test_files[@]}" --junitxml "$out_dir/cuda_tests.xml"

wait "$sanitizer_pid"
runs=$("$py" "$support" sanitizer-runs | wc -l)
passed=$(awk -F'\t' '$3 == "ok"' "$out_dir/sanitizer.tsv" | wc -l)
if (( passed == runs )); then sanitizer_status=ok; else sanitizer_status=failed; fi
record sanitizer "$sanitizer_status" $(( passed != runs )) $(( SECONDS - sanitizer_begin )) sanitizer.tsv \
  "$passed of $runs runs clean: $(awk -F'\t' '{ printf "%s %s %s; ", $1, $2, $3 }' "$out_dir/sanitizer.tsv")"

# 5. Benchmarks, alone on the GPU now.
step bench_fused_aux_fc 60 bench_fused_aux_fc.log "$py" benchmarks/bench_fused_aux_fc.py --device cuda \
  --dtype bf16 --budget 0.3 --out "$out_dir/fused_aux_fc_cuda.json"
step bench_tree_ops 60 bench_tree_ops.log "$py" benchmarks/bench_tree_ops.py --device cuda --budget 0.2 \
  --reference-bs 2 --out "$out_dir/tree_ops_cuda.json"
step bench_tree_attention 60 bench_tree_attention.log "$py" benchmarks/bench_tree_attention.py --device cuda \
  --dtype bf16 --budget 0.2 --prefix 1024 16384 --tree 8 64 --batch 1 32 --out "$out_dir/tree_attention_cuda.json"
step bench_tree_attention_paged 60 bench_tree_attention_paged.log "$py" benchmarks/bench_tree_attention.py \
  --device cuda --dtype bf16 --budget 0.2 --paged 16 --prefix 4096 --tree 32 --batch 8 \
  --out "$out_dir/tree_attention_paged_cuda.json"
for preset in decode-8b prefill-8b decode-70b; do
  step "native_$preset" 30 "native_$preset.log" "${native_env[@]}" "$native" --device cuda --preset "$preset" \
    --repeat 20 --json "$out_dir/native_${preset}_cuda.json"
done

# 6. The report.
finish
