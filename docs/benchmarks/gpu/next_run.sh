#!/usr/bin/env bash
# What the next lent GPU runs (about nine minutes), as one command, with .whl carried as for
# device_run.sh, most wanted first, each merged into a copy of h200/bench.json that comes back
# in $OUT (then here: monet_opt.bench report.write / plots.write into docs/benchmarks/gpu/h200/):
#   - U-Net against inductor at budgets 0.1 and 0.0: at 0.5 and 0.3 (sixth lease) it held 8.2-9.0
#     GiB where our half holds 5.64, so there was no point at equal peak (issue 5);
#   - GPT-2 against inductor at budgets 0.5 and 0.3 in the same run as our half (the third
#     lease's budget 0.5, 5,871 MiB at +6.5 %, and the fourth's half, 5,203 MiB at +3.7 %, came
#     from different runs);
#   - BERT-base at its least peak, now a rematerialized plan's (NOTE [Rematerializing under the
#     budget]; 1,656 -> 1,404 MiB on the kept H200 problem, docs/benchmarks/remat.md): the first
#     such plan run on a GPU, its measured peak and time against the prediction;
#   - DenseNet-121 at all limits, in the time left: the fifth lease's points carry the ~20 ms
#     a step our store-all step has lost since (sixth lease, step_gap.py: +23.6 % -> +1.3 %);
#   - in the time left, ResNet-50 at all limits: its auto points were solved with HiGHS stalled
#     after fork (NOTE [HiGHS after fork]; its least at +152 %).
# Earlier runs on an H200: docs/benchmarks/gpu/README.md.
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
bench 160 --models unet --limits 100,50,min --compile-budgets 0.1,0.0 \
    | tee "$OUT/bench_unet.log"
bench 200 --models gpt2 --limits 100,50,a33,min --compile-budgets 0.5,0.3 \
    | tee "$OUT/bench_gpt2.log"
bench 150 --models bert_base --limits min --compile-budgets none \
    | tee "$OUT/bench_bert_base.log"
bench 230 --models densenet121 --limits 100,50,a33,min --compile-budgets none \
    | tee "$OUT/bench_densenet121.log"
bench 200 --models resnet50 --limits 100,50,a33,min --compile-budgets none \
    | tee "$OUT/bench_resnet50.log"
echo "ended at ${SECONDS}s"
