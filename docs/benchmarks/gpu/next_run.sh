#!/usr/bin/env bash
# What the next lent GPU runs (about nine and a half minutes), as one command, with .whl carried
# as for device_run.sh, most wanted first:
#   - NOTE [Constant attention masks] on the GPU: HF GPT-2 (no dropout, batch 8 x 1,024) with
#     the traced causal mask kept and dropped, against eager (attention_masks.md);
#   - HF Llama with grouped-query attention, the same way (about a minute);
#   - which attention kernels eager and our step run under bfloat16 autocast (sdpa_kernels.py);
#   - every CUDA contract test (tests/test_cuda.py; the last two were cut at 170 s before);
#   - `monet-opt bench` of GPT-2 again (before the note: +10.8 % at eager's peak, predicted
#     +0.1 %), without torch.compile (measured then: 142 s to compile), then U-Net, DenseNet-121
#     and BERT-base at their GPU sizes for what time is left (bench.json is saved after each
#     model; bench.md and the plots are made from it here, with report.write and plots.write);
#   - bf16_memory.py: when each block alive at the bfloat16 plan's measured peak was made and
#     freed (one of 64,000 B, made by the autograd engine, is not in float32's).
# Earlier runs on an H200 (2026-11-26): docs/benchmarks/gpu/README.md.
source docs/benchmarks/gpu/device_setup.sh
git log -1 --format='commit %h %s' 2>/dev/null
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
END=${END_S:-560}
timeout 120 python3 docs/benchmarks/attention_masks.py --device cuda --batch 8 \
    --seq 1024 --rounds 7 2>&1 | grep -v -i "warn\|^monet_opt:" > "$OUT/attention_masks.md"
cat "$OUT/attention_masks.md"
# HF Llama, 4 query heads per key/value head: on CUDA our traced call stays the memory-efficient
# kernel with repeated keys (NOTE [Grouped-query attention]); how far that is from eager's
timeout 100 python3 docs/benchmarks/attention_masks.py --device cuda --batch 4 --seq 1024 \
    --rounds 5 --width 1024 --heads 16 --vocab 32000 --kv-heads 4 --layers 8 2>&1 \
    | grep -v -i "warn\|^monet_opt:" > "$OUT/grouped_attention.md"
cat "$OUT/grouped_attention.md"
# Which attention kernel eager and our step run under bfloat16 autocast, dropout off and on,
# and whether the gradients agree (sdpa_kernels.py; about a minute)
timeout 90 python3 docs/benchmarks/gpu/sdpa_kernels.py 2>&1 | grep "^torch\|^dropout" \
    > "$OUT/sdpa_kernels.txt"
cat "$OUT/sdpa_kernels.txt"
timeout 200 python3 -m pytest -q -rxX --tb=short -p no:cacheprovider tests/test_cuda.py \
    > "$OUT/test_cuda.log" 2>&1
tail -n 12 "$OUT/test_cuda.log"
mkdir -p /tmp/gpu
timeout $((END - 75 - SECONDS)) python3 -m monet_opt.cli bench --device cuda \
    --models gpt2,unet,densenet121,bert_base --limits 100,50,a33,min --solvers auto \
    --compile-budgets none --rounds 5 --time-limit 12 --no-merge --out /tmp/gpu 2>&1 \
    | grep -v -i "warn" > "$OUT/bench_gpu.log"
tail -n 40 "$OUT/bench_gpu.log"
cp /tmp/gpu/bench.json "$OUT/" 2>/dev/null
timeout 70 python3 docs/benchmarks/gpu/bf16_memory.py 2>&1 | grep -v -i "warn" \
    | grep -v "^  \(forward\|backward\) " > "$OUT/bf16_memory.txt"
cat "$OUT/bf16_memory.txt"
echo "ended at ${SECONDS}s"
