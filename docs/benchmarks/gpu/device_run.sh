#!/usr/bin/env bash
# What this folder's figures came from, as one command for a lent GPU machine (the device
# tool runs it in a copy of the checkout; its python3 has torch, torchvision and transformers
# but not HiGHS). Beforehand, here:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 -d .whl highspy==1.12.0
# (with /.whl/ in .git/info/exclude), then run this with .whl carried. It writes under $OUT:
# the CUDA contract tests' log, the lowered problems for `make bench-variants` to solve here
# (python -m monet_opt.bench_variants --gpu-sizes --problems problems_gpu.json.gz), and the
# side-by-side benchmark at MONeT's ResNet-50 batch.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
timeout 200 python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_cuda.py \
    > "$OUT/test_cuda.log" 2>&1
grep -E "passed|failed" "$OUT/test_cuda.log"
timeout 60 python3 -m monet_opt.bench_variants --lower-only --device cuda \
    --models resnet50,gpt2_narrow --problems "$OUT/problems_gpu.json.gz" > "$OUT/lower.log" 2>&1
timeout 390 python3 -m monet_opt.cli bench --device cuda --models resnet50 \
    --limits 100,50,a33,min --solvers auto --compile-budgets 0.5 --rounds 5 --time-limit 20 \
    --no-merge --out "$OUT/gpu" 2>&1 | grep -v -i "warn" | tee "$OUT/bench_gpu.log"
