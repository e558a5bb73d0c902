#!/usr/bin/env bash
# What the next lent GPU should run (about eight minutes; nothing here has run yet), as one
# command, with .whl carried as for device_run.sh:
#   - the BatchNorm contract test as it now stands (its memory check with out.sum());
#   - ResNet-50 (batch 184) lowered with cuDNN's BatchNorm, variants off and on, into
#     problems_gpu.json.gz, for the solvers to be studied here (the committed file holds the
#     H100's, with ATen's BatchNorm times);
#   - GoogLeNet at MONeT's batch (320) beside checkpointing and torch.compile (budget 0.5): its
#     run in 2026-11-26's session was cut before its report.
# It keeps to the device tool's eight files: the log, the problems and one bench folder's JSON
# and markdown (the plots are made here from the JSON: monet_opt.bench.plots.write).
source docs/benchmarks/gpu/device_setup.sh
log="$OUT/log.txt"
timeout 60 python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_cuda.py -k batchnorm \
    >> "$log" 2>&1
tail -n 3 "$log"
timeout 90 python3 -m monet_opt.bench_variants --lower-only --device cuda --models resnet50 \
    --problems "$OUT/problems_gpu.json.gz" >> "$log" 2>&1
# optimize()'s own 30 s per solve: near ResNet-50's least peak on the GPU problem, auto found
# +45 % in 30 s and +241-257 % in 20-23 s (docs/benchmarks/gpu/README.md)
timeout 330 python3 -m monet_opt.cli bench --device cuda --models googlenet \
    --limits 100,50,a33,min --solvers auto --compile-budgets 0.5 --rounds 5 --time-limit 30 \
    --no-merge --out "$OUT/googlenet" 2>&1 | grep -v -i "warn" >> "$log"
rm -f "$OUT"/googlenet/*.png
tail -n 25 "$log"
