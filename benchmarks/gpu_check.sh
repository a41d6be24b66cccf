#!/usr/bin/env bash
# The GPU checks a lent machine runs in one call (docs/validation/gpu.md records the results):
# the profiler's CUDA path against the shipped profile of that GPU, the runtime's CUDA path
# (tests/test_runtime_cuda.py: offloaded logits = the CPU forward pass), and `hrm validate` on
# CUDA with the profile just measured (or with MEASURED_PROFILE, skipping the profiler).
# Usage: bash benchmarks/gpu_check.sh OUT_DIR [SHIPPED_PROFILE [MEASURED_PROFILE]]
# Missing packages travel as wheels in .whl/ (pydantic, pulp, highspy: the device image lacks them).
set -u
out=${1:?usage: gpu_check.sh OUT_DIR [SHIPPED_PROFILE]}
shipped=${2:-hardware_profiles/h200.yaml}
measured=${3:-}
mkdir -p "$out"
exec > >(tee "$out/log.txt") 2>&1
export PYTHONUNBUFFERED=1 HRM_PROGRESS=0
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
step() { echo; echo "=== $* ($(date +%T))"; }
step machine
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,pcie.link.gen.max,pcie.link.width.max --format=csv
nproc; free -g | head -2
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
if [ -z "$measured" ]; then
  step "hrm profile (full curves, 120 s budget) vs $shipped"
  timeout 170 python3 -m hrm_cli profile --device cuda --budget 120 --no-progress --no-disk --name measured-gpu \
    --out "$out/measured.yaml" --compare "$shipped"; echo "rc=$?"
  prof="$out/measured.yaml"
  [ -f "$prof" ] || prof=$shipped
else
  prof=$measured
fi
step "runtime CUDA path: offloaded logits = CPU forward"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_runtime_cuda.py; echo "rc=$?"
step "hrm validate tiny-mixtral fp32 on CUDA ($prof)"
timeout 90 python3 -m hrm_cli validate --hw "$prof" --model tiny-mixtral --device cuda --out /tmp/val/tiny-mixtral-fp32
echo "rc=$?"
step "hrm validate small-mixtral bf16 on CUDA ($prof)"
timeout 120 python3 -m hrm_cli validate --hw "$prof" --model small-mixtral --device cuda --dtype bf16 \
  --out /tmp/val/small-mixtral-bf16; echo "rc=$?"
if [ -z "${GPU_CHECK_SHORT:-}" ]; then  # GPU_CHECK_SHORT=1: leave out this third validation
  step "hrm validate small-mixtral fp32 on CUDA ($prof)"
  timeout 120 python3 -m hrm_cli validate --hw "$prof" --model small-mixtral --device cuda --dtype fp32 \
    --out /tmp/val/small-mixtral-fp32; echo "rc=$?"
fi
tar czf "$out/validate.tgz" -C /tmp val 2>/dev/null
step done
