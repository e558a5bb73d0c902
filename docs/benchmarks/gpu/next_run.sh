#!/usr/bin/env bash
# What the next lent GPU should run (about five minutes), as one command, with .whl carried as
# for device_run.sh:
#   - every CUDA contract test (tests/test_cuda.py), the bfloat16 autocast memory xfail among
#     them (60.7 KB over on an H200, 2026-11-26);
#   - bf16_memory.py: where that plan's measured peak goes past its prediction (the allocator's
#     trace at the peak, largest blocks first, against float32's, which fits).
# Earlier next_run.sh (attention, GoogLeNet b320, ResNet-50 with 30 s solves) ran on an H200 on
# 2026-11-26: docs/benchmarks/gpu/README.md.
source docs/benchmarks/gpu/device_setup.sh
log="$OUT/log.txt"
git log -1 --format='commit %h %s' 2>/dev/null
timeout 220 python3 -m pytest -q -rxX --tb=short -p no:cacheprovider tests/test_cuda.py \
    >> "$log" 2>&1
tail -n 15 "$log"
timeout 150 python3 docs/benchmarks/gpu/bf16_memory.py 2>&1 | grep -v -i "warn" \
    > "$OUT/bf16_memory.txt"
cat "$OUT/bf16_memory.txt"
