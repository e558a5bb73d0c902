#!/usr/bin/env bash
# What the next lent GPU runs (about nine minutes), as one command, with .whl carried as for
# device_run.sh, most wanted first, each merged into a copy of h200/bench.json that comes back
# in $OUT (then here: monet_opt.bench report.write / plots.write into docs/benchmarks/gpu/h200/):
#   - GPT-2 against inductor at budgets 0.5 and 0.3 in the same run as our half (the seventh
#     lease was cut while they compiled: inductor's first call on GPT-2 took 131 s there, so
#     this one has 420 s);
#   - DenseNet-121 op by op at half its activations (bench_ops: each ATen op's kernel time,
#     eager, store-all and the plan): the seventh lease measured its half at +20.0 % where
#     +6.5 % was predicted (store-all +9.5 %, eager's noise 4.4 %); are the kernels slower than
#     profiled, or is it the host?
#   - in the time left, ResNet-50 at all limits: its auto points were solved with HiGHS stalled
#     after fork (NOTE [HiGHS after fork]; its least at +152 %).
# Earlier runs on an H200: docs/benchmarks/gpu/README.md (U-Net against inductor down to budget
# 0.0, DenseNet-121 and BERT-base's least: the seventh lease).
source docs/benchmarks/gpu/device_setup.sh
git log -1 --format='commit %h %s' 2>/dev/null
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
nproc; grep -m1 "model name" /proc/cpuinfo
END=${END_S:-560}
mkdir -p /tmp/gpu && cp docs/benchmarks/gpu/h200/bench.json /tmp/gpu/
bench() {  # seconds, then the bench's arguments
    local left=$((END - SECONDS - 10)) limit=$1
    shift
    [ "$left" -lt 60 ] && { echo "skipped $*: ${left}s left"; return; }
    timeout "$(( left < limit ? left : limit ))" python3 -m monet_opt.cli bench --device cuda \
        --solvers auto --rounds 5 --time-limit 12 --out /tmp/gpu "$@" 2>&1 | grep -v -i "warn"
    cp /tmp/gpu/bench.json "$OUT/"  # after each model: what ran comes back if the next is cut
}
# a model's run is replaced whole: GPT-2 keeps its a33 point; ResNet-50 runs apart (its
# inductor point stays in h200/bench.json; merge its points by hand)
bench 400 --models gpt2 --limits 100,50,a33,min --compile-budgets 0.5,0.3 \
    | tee "$OUT/bench_gpt2.log"
left=$((END - SECONDS - 20))
[ "$left" -gt 60 ] && timeout "$(( left < 130 ? left : 130 ))" python3 -m monet_opt.bench_ops \
    --device cuda --model densenet121 --size batch=128,size=224 --share 0.5 --rounds 5 \
    --time-limit 12 --profile-dir profiles 2>&1 | grep -v -i "warn\|USDT" \
    > "$OUT/ops_densenet121.md"
left=$((END - SECONDS - 10))
if [ "$left" -gt 60 ]; then
    mkdir -p /tmp/gpu_r50 "$OUT/resnet50"
    timeout "$left" python3 -m monet_opt.cli bench --device cuda --solvers auto --rounds 5 \
        --time-limit 12 --out /tmp/gpu_r50 --models resnet50 --limits 100,50,a33,min \
        --compile-budgets none 2>&1 | grep -v -i "warn" | tee "$OUT/bench_resnet50.log"
    cp /tmp/gpu_r50/bench.json "$OUT/resnet50/" 2>/dev/null
else
    echo "skipped resnet50: ${left}s left"
fi
echo "ended at ${SECONDS}s"
