#!/usr/bin/env bash
# FlexGen ground truth on a lent GPU, in one device call (docs/validation/flexgen_gpu_plan.md):
#   1. launch and host-DRAM microbenchmarks (the harness's launch_bench.py, dram_bench.py), and a
#      kernel's floor in a replayed CUDA graph (benchmarks/ground_truth/graph_floor.py);
#   2. the FlexGen policies of benchmarks/ground_truth/flexgen_policies.txt (real
#      lynnliu030/FlexGen@a80c8d15, 4-layer Mixtral-8x7B, dummy weights) through the harness's
#      run_flexgen.sh, each its own process, failures recorded and skipped past;
#   3. with the time left: `hrm profile --device cuda` of this box, the harness's gpu_check.py;
#   4. the results JSONL converted to a runs file (benchmarks/ground_truth/flexgen_runs.py).
# Run from the repository root, the harness copy carried as the ignored folder .gpu-harness/
# (gpu/ = ../shared/gpu, gpu/work/FlexGen/flexgen/ = the fork's source, .whl/ = wheels):
#   run(command="bash benchmarks/ground_truth/flexgen_gpu.sh", carry=[".gpu-harness"], timeout_s=570)
# Everything it keeps goes to $OUT (the device tool's; default out/flexgen-gpu), at most 8
# files at any time: flexgen_gpu.log, micro.jsonl, sysinfo.txt, flexgen_results.jsonl,
# flexgen_logs.txt, TAG-flexgen-box.yaml, gpu_check.json, flexgen-TAG.yaml (TAG: h100 or h200,
# from nvidia-smi; GPU_TAG overrides).
# Env: FLEXGEN_GPU_BUDGET_S (whole script, default 480), RESERVE_TAIL_S (kept after the
# policies for steps 3-4, default 80), POLICY_TIMEOUT_S (default 90), POLICIES, PYTHON
# (FlexGen's interpreter, default python3), HRM_PYTHON (an interpreter that has hrm's
# dependencies; default: PYTHON with .gpu-harness/.whl/hrm/*.whl installed to /tmp/hrm-site),
# HARNESS (default .gpu-harness), PROFILE_DEVICE (default cuda). CPU dry run (plumbing only,
# fake GPU): FLEXGEN_ENTRY=$PWD/.gpu-harness/gpu/flexgen/tests/fake_gpu_flex_moe.py and
# MAKE_MODEL_ARGS, as docs/validation/flexgen_gpu_plan.md shows. Nothing here listens on a
# port or downloads anything: the model dir is written locally, weights are dummies.
set -uo pipefail
T0=$(date +%s)
REPO=$(pwd)
H=$(cd "${HARNESS:-$REPO/.gpu-harness}" 2>/dev/null && pwd) || { echo "FATAL: no harness at ${HARNESS:-.gpu-harness} (carry it)"; exit 2; }
OUT=${OUT:-$REPO/out/flexgen-gpu}
PY=${PYTHON:-python3}
BUDGET=${FLEXGEN_GPU_BUDGET_S:-480}
RESERVE=${RESERVE_TAIL_S:-70}
POLICIES=$(realpath "${POLICIES:-$REPO/benchmarks/ground_truth/flexgen_policies.txt}")
# the GPU's short name (h100, h200) names the profile and the runs file
TAG=${GPU_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oi 'h[0-9]\{3\}' | head -1 | tr 'A-Z' 'a-z')}
TAG=${TAG:-gpu}
PROFILE="$OUT/$TAG-flexgen-box.yaml"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/flexgen_gpu.log") 2>&1
el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(el) )); }
step() { echo; echo "=== [$(el)s] $*"; }
step "start $(date -u +%FT%TZ) OUT=$OUT budget=${BUDGET}s gpu=$TAG repo=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
for f in "$H/gpu/flexgen/run_flexgen.sh" "$H/gpu/work/FlexGen/flexgen/flex_moe.py" "$H/gpu/launch_bench.py" "$H/gpu/dram_bench.py"; do
  [ -f "$f" ] || { echo "FATAL: $f missing: carry .gpu-harness (see docs/validation/flexgen_gpu_plan.md)"; exit 2; }
done
nvidia-smi -L 2>&1 | head -2
# the box's toolchain, for the next plan (llama.cpp's CUDA backend needs nvcc and cmake here:
# nothing outside the box can be reached)
echo "[gpu] toolchain: nvcc=$(command -v nvcc || echo none) cmake=$(command -v cmake || echo none) g++=$(command -v g++ || echo none) cuda_dirs=$(ls -d /usr/local/cuda* 2>/dev/null | tr '\n' ' ')"

# 1. microbenchmarks: one JSON line each in micro.jsonl, {"bench", "rc", "seconds", "result"}
micro() {  # NAME SCRIPT TIMEOUT
  local t r rc tmp
  t=$(date +%s); tmp=$(mktemp)
  timeout -k 5 "$3" "$PY" "$2" > "$tmp"; rc=$?
  r=$(tail -1 "$tmp"); rm -f "$tmp"
  case "$r" in "{"*"}") ;; *) r=null ;; esac
  echo "{\"bench\": \"$1\", \"rc\": $rc, \"seconds\": $(( $(date +%s) - t )), \"result\": $r}" | tee -a "$OUT/micro.jsonl"
}
step "launch_bench (eager op, op+sync, CPU op costs)"
micro launch "$H/gpu/launch_bench.py" 60
step "dram_bench (host DRAM read/copy, pinned/pageable H2D, H2D under CPU traffic)"
micro dram "$H/gpu/dram_bench.py" 90
step "graph_floor (a kernel's floor in a replayed CUDA graph, a decode matvec in one: llama.cpp's batch-1 GPU decode)"
micro graph "$REPO/benchmarks/ground_truth/graph_floor.py" 60

# 2. the policies (the harness: sysinfo.txt, flexgen_results.jsonl, flexgen_logs.txt)
POLICY_BUDGET=$(( $(left) - RESERVE ))
step "FlexGen policies: $(grep -cv '^\s*\(#\|$\)' "$POLICIES") in $POLICIES, budget ${POLICY_BUDGET}s"
( cd "$H" && OUT="$OUT" PYTHON="$PY" POLICIES="$POLICIES" TOTAL_BUDGET_S="$POLICY_BUDGET" \
    POLICY_TIMEOUT_S="${POLICY_TIMEOUT_S:-90}" SKIP_GPU_CHECK=1 bash gpu/flexgen/run_flexgen.sh )
# run_flexgen.sh tees its own log, a copy of what ours has; the policy file is committed
rm -f "$OUT/run_flexgen.log" "$OUT/policies.txt"

# 3. hrm profile of this box, then the harness's gpu_check, with the time left
HRM_PY=${HRM_PYTHON:-}
if [ -z "$HRM_PY" ]; then
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/hrm-site "$H"/.whl/hrm/*.whl >/dev/null 2>&1; then
    HRM_PY="env PYTHONPATH=/tmp/hrm-site:$REPO $PY"
  else
    echo "[gpu] hrm wheels not installed (.gpu-harness/.whl/hrm): no profile, no conversion here"
  fi
else
  HRM_PY="env PYTHONPATH=$REPO $HRM_PY"
fi
B=$(( $(left) - 30 )); [ "$B" -gt 45 ] && B=45
if [ -n "$HRM_PY" ] && [ "$B" -ge 20 ]; then
  step "hrm profile --device ${PROFILE_DEVICE:-cuda} --budget ${B}"
  HRM_PROGRESS=0 timeout -k 5 $(( B + 30 )) $HRM_PY -m hrm_cli profile --device "${PROFILE_DEVICE:-cuda}" --budget "$B" \
    --no-progress --no-disk --name "$TAG-flexgen-box" --out "$PROFILE" --compare "$REPO/hardware_profiles/${TAG/gpu/h100}.yaml"
  echo "[gpu] hrm profile rc=$?"
else
  echo "[gpu] no hrm profile (${B}s of budget left for it)"
fi
if [ "$(left)" -ge 45 ]; then
  step "gpu_check (shim ops on CUDA, fused_moe vs naive, shim op timings)"
  PYTHONPATH="$H/gpu/flexgen/shim:$H/gpu/work/FlexGen" timeout -k 5 40 "$PY" "$H/gpu/flexgen/gpu_check.py" "$OUT/gpu_check.json" \
    | tail -15; echo "[gpu] gpu_check rc=${PIPESTATUS[0]}"
fi

# 4. the runs file (the definitive one is rewritten at home from the returned JSONL)
if [ -n "$HRM_PY" ] && [ -s "$OUT/flexgen_results.jsonl" ]; then
  step "convert to a runs file"
  HW=$PROFILE; [ -s "$HW" ] || HW=$REPO/docs/validation/$TAG-measured.yaml
  [ -s "$HW" ] || HW=$REPO/docs/validation/h100-measured.yaml
  timeout -k 5 30 $HRM_PY "$REPO/benchmarks/ground_truth/flexgen_runs.py" "$OUT/flexgen_results.jsonl" \
    --out "$OUT/flexgen-$TAG.yaml" --hardware "$HW" ${MODEL_CONFIG:+--model "$MODEL_CONFIG"}
  echo "[gpu] convert rc=$?"
fi
step "done; OUT holds: $(ls "$OUT" | tr '\n' ' ')"
