#!/usr/bin/env bash
# Fills a wheelhouse (default .whl/) on a machine with internet for benchmarks/gpu_check.sh on
# a GPU machine without: the nvidia-cutlass wheel (the CUTLASS/CuTe headers of fused_aux_fc's
# sm_90a kernel, downloaded alone) and the build and test packages a GPU machine may lack (each
# with its dependencies), as binary wheels for the GPU machine's Python, manylinux x86_64,
# whatever Python and platform this machine runs.
#
#   bash benchmarks/prepare_wheelhouse.sh [--dest DIR] [--python-version X.Y] [--dry-run] [PACKAGE ...]
#
# PACKAGE: cutlass, scikit-build-core, pybind11, pytest, ninja, cmake, numpy, transformers or
# all; without one, all but the optional numpy and transformers (the latter lets
# test_hf_attention.py's CUDA tests run). gpu_check.sh installs only what is missing there.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.whl
python_version=3.12
dry_run=0
names=()
while (( $# )); do
  case $1 in
    --dest) dest=$2; shift 2 ;;
    --python-version) python_version=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) sed -n '2,12p' "$0" | cut -c3-; exit 0 ;;
    -*) echo "prepare_wheelhouse.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) names+=("$1"); shift ;;
  esac
done
py=${PYTHON:-python3}
lines=$($py benchmarks/gpu_check_support.py wheels ${names[@]+"${names[@]}"})
# manylinux_2_28 takes in every older manylinux tag (manylinux2014 included).
target=(--only-binary=:all: --python-version "$python_version" --implementation cp
        --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64)
mkdir -p "$dest"
while IFS=$'\t' read -r requirement deps; do
  cmd=("$py" -m pip download -q "${target[@]}" -d "$dest" "$requirement")
  [[ $deps == nodeps ]] && cmd+=(--no-deps)
  echo "+ ${cmd[*]}"
  (( dry_run )) || "${cmd[@]}"
done <<< "$lines"
(( dry_run )) && exit 0
echo "wheelhouse $dest:"
ls -s1h "$dest"/*.whl
du -sh "$dest"
