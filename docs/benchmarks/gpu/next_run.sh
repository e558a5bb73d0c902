#!/usr/bin/env bash
# What the next lent GPU should run (about nine and a half minutes), as one command, with .whl
# carried as for device_run.sh:
#   - every CUDA contract test (tests/test_cuda.py), the memory-efficient attention's stand-in
#     and the BatchNorm memory check among them;
#   - attention's implementations at GPT-2's shapes, and where GPT-2 (batch 8 x 1024, dropout
#     0) is offered the stand-in (monet_opt.bench_attention);
#   - GoogLeNet at MONeT's batch (320) beside checkpointing and torch.compile (budget 0.5).
# It keeps to the device tool's eight files: the log, the attention tables and one bench
# folder's JSON and markdown (the plots are made here from the JSON: plots.write).
source docs/benchmarks/gpu/device_setup.sh
log="$OUT/log.txt"
git log -1 --format='commit %h %s' 2>/dev/null
timeout 190 python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_cuda.py >> "$log" 2>&1
tail -n 12 "$log"
timeout 80 python3 -m monet_opt.bench_attention --gpt2 8x1024 2>&1 | grep -v -i "warn" \
    > "$OUT/attention.md"
cat "$OUT/attention.md"
timeout 290 python3 -m monet_opt.cli bench --device cuda --models googlenet \
    --limits 100,50,a33,min --solvers auto --compile-budgets 0.5 --rounds 5 --time-limit 25 \
    --no-merge --out "$OUT/googlenet" 2>&1 | grep -v -i "warn" >> "$log"
rm -f "$OUT"/googlenet/*.png
tail -n 25 "$log"
