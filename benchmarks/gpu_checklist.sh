#!/usr/bin/env bash
# The GPU checks of docs/gpu.md in one unattended pass, for a short loan of a GPU machine: the CUDA tests,
# step times of Llama-3.1-8B (random bf16 weights) with and without CUDA graphs, with MBU/MFU from the
# engine's telemetry beside torch's profiler, and calibration against the shipped H100 profile.
# Each part has its own time limit, so one that hangs or fails leaves the others' results.
#
#   OUT=gpu-results bash benchmarks/gpu_checklist.sh [tests] [attention] [graphs] [eager] [profile]
#   (default: all five)
#
# Results: $OUT/{device.txt,tests.log,attention.log,attention_check.json,step_graphs.{json,log},step_eager.{json,log},
# profile_check.{json,log}}; attention.log: the backends against the CPU's fp32 reference inside the engine,
# request by request (benchmarks/gpu_attention_check.py).
# The machine needs torch with CUDA, triton, numpy, scipy, pyyaml, jinja2, prometheus-client, psutil,
# nvidia-ml-py and gguf; wheels of anything missing may be put in .whl/ (installed to /tmp/site first).
set -u
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
parts=${*:-tests attention graphs eager profile}
STEP_ARGS="--model llama-3.1-8b --device cuda --dtype bf16 --batch-sizes 1 8 32 64 128 --chunk 512 2048
           --hardware-profile h100-llama3.1-8b --wait-idle 2"

{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  nproc; } > "$OUT/device.txt" 2>&1

for part in $parts; do
    start=$(date +%s)
    case $part in
    tests)   timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE --tb=short tests/test_cuda_engine.py \
                 tests/test_triton_attention.py tests/test_device_sampler.py > "$OUT/tests.log" 2>&1 ;;
    attention) timeout 150 python3 benchmarks/gpu_attention_check.py --json "$OUT/attention_check.json" > "$OUT/attention.log" 2>&1 ;;
    graphs)  timeout 120 python3 benchmarks/step_time.py $STEP_ARGS --torch-profile 5 \
                 --json "$OUT/step_graphs.json" > "$OUT/step_graphs.log" 2>&1 ;;
    eager)   timeout 80 python3 benchmarks/step_time.py $STEP_ARGS --no-cuda-graphs --steps 10 \
                 --json "$OUT/step_eager.json" > "$OUT/step_eager.log" 2>&1 ;;
    profile) timeout 110 python3 benchmarks/gpu_profile_check.py --device cuda --model llama-3.1-8b --dtype bf16 \
                 --profile h100-llama3.1-8b --points 30 --time-limit-s 80 \
                 --json "$OUT/profile_check.json" > "$OUT/profile_check.log" 2>&1 ;;
    *)       echo "unknown part $part"; continue ;;
    esac
    echo "$part: exit $? in $(( $(date +%s) - start )) s"
done | tee "$OUT/summary.txt"
