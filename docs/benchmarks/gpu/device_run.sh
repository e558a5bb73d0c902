#!/usr/bin/env bash
# This folder's GPU run as one command for a lent GPU machine (the device tool runs it in a copy
# of the checkout; its python3 has torch, torchvision and transformers but not HiGHS).
# Beforehand, here:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 -d .whl highspy==1.12.0
# (with /.whl/ in .git/info/exclude), then run this with .whl carried. It writes under $OUT:
# the CUDA contract tests' log (the BatchNorm test first), ATen's BatchNorm kernels against
# cuDNN's on ResNet-50's shapes (bn.md), the side-by-side benchmark at MONeT's ResNet-50 batch
# (gpu/), and where our executor's step time goes against eager's, op by op (ops.md, from the
# benchmark's cached profile). Steps are capped so that the whole fits in nine minutes.
source docs/benchmarks/gpu/device_setup.sh
git log -1 --format='commit %h %s' 2>/dev/null; git status --short 2>/dev/null | head
tests() {
    timeout "$1" python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_cuda.py "${@:2}" \
        >> "$OUT/test_cuda.log" 2>&1
    tail -n 3 "$OUT/test_cuda.log"
}
tests 120 -k batchnorm
timeout 90 python3 -m monet_opt.bench_bn > "$OUT/bn.md" 2>&1
cat "$OUT/bn.md"
timeout 300 python3 -m monet_opt.cli bench --device cuda --models resnet50 \
    --limits 100,50,a33,min --solvers auto --compile-budgets 0.5 --rounds 5 --time-limit 20 \
    --no-merge --out "$OUT/gpu" 2>&1 | grep -v -i "warn" > "$OUT/bench_gpu.log"
tail -n 40 "$OUT/bench_gpu.log"
tests "${REST_S:-150}" -k "not batchnorm"
timeout 90 python3 -m monet_opt.bench_ops --device cuda --size batch=184,size=224 --share 0.5 \
    --rounds 5 --time-limit 20 --profile-dir profiles 2>&1 | grep -v -i "warn\|USDT" \
    > "$OUT/ops.md"
tail -n 25 "$OUT/ops.md"
