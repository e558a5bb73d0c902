# Set-up is part of every target: a fresh clone needs only `make demo` or `make test`.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install demo test test-serial bench bench-channels-last bench-solvers bench-near-floor bench-bounds bench-variants bench-coverage bench-replan bench-ops bench-late
install: $(VENV)/.installed

# torch 2.14.1 / torchvision 0.29.1 come from this machine's local disk (see research/env.md).
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

demo: install
	$(VENV)/bin/monet-opt demo

# One pytest worker per core (pytest-xdist), each on one thread: the suite is mostly Python
# (tracing, solving), and on 2 cores this halves it (19 -> 10 min). Under that load auto's
# time-limited phases end elsewhere; the one test that then failed (a replayed dropout's state,
# which the live-bytes counter did not see: NOTE [Tensors made outside the dispatcher]) is fixed.
test: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto

# The suite on one process (about 26 min on 2 slow cores), for a failure to read in order.
test-serial: install
	$(PY) -m pytest -q

# The solver benchmark (minutes): writes docs/benchmarks/solvers.md.
bench-solvers: install
	$(PY) -m monet_opt.bench_solvers > docs/benchmarks/solvers.md

# "auto" at its least peak and a little above it, on the CPU problems kept in the file (minutes):
# writes docs/benchmarks/near_floor.md.
NEAR_FLOOR := $(PY) -m monet_opt.bench_solvers --near-floor 2 --time-limit 30 \
	--problems docs/benchmarks/problems_cpu.json.gz
# monet-opt bench's own ResNet-50 profile at afc06bc, where auto's plan at 289.9 MiB took +48.8 %.
NEAR_FLOOR_BENCH := $(PY) -m monet_opt.bench_solvers --near-floor 2 --time-limit 30 \
	--problems docs/benchmarks/problems_bench_resnet50.json.gz --models resnet50 \
	--size batch=16,size=128
bench-near-floor: install
	$(NEAR_FLOOR) --models resnet50 --size batch=16,size=128 > docs/benchmarks/near_floor.md
	$(NEAR_FLOOR) --models googlenet --size batch=32,size=128 >> docs/benchmarks/near_floor.md
	$(NEAR_FLOOR_BENCH) >> docs/benchmarks/near_floor.md
	$(NEAR_FLOOR_BENCH) --above 0.006,0.013,0.019,0.03 >> docs/benchmarks/near_floor.md

# The least overhead any schedule can have at half, a third and a quarter of the activations,
# beside auto's, on the H200's ResNet-50 problem and this CPU's ResNet-50 and GoogLeNet, then
# what the H200's schedules recompute and the bound were a recomputed BatchNorm one pass (26
# minutes): writes docs/benchmarks/bounds.md.
BOUNDS := $(PY) -m monet_opt.bench_solvers --bounds --time-limit 60
bench-bounds: install
	$(BOUNDS) --models resnet50 --size batch=184,size=224 --device cuda \
		--problems docs/benchmarks/gpu/h200/problems_h200.json.gz > docs/benchmarks/bounds.md
	$(BOUNDS) --models resnet50 --size batch=16,size=128 \
		--problems docs/benchmarks/problems_cpu.json.gz >> docs/benchmarks/bounds.md
	$(BOUNDS) --models googlenet --size batch=32,size=128 \
		--problems docs/benchmarks/problems_cpu.json.gz >> docs/benchmarks/bounds.md
	$(PY) docs/benchmarks/gpu/bn_pass_bound.py --time-limit 60 >> docs/benchmarks/bounds.md

# The operator-variant ablation (minutes): writes docs/benchmarks/variants.md, and with the
# lossy families offered too, docs/benchmarks/variants_lossy.md.
bench-variants: install
	$(PY) -m monet_opt.bench_variants > docs/benchmarks/variants.md
	$(PY) -m monet_opt.bench_variants --lossy --time-limit 15 > docs/benchmarks/variants_lossy.md

# The contract on models beyond the bench's (minutes): writes docs/benchmarks/coverage.md.
# Every model in monet_opt/bench_coverage.py (about half an hour): writes coverage_run.md, beside
# docs/benchmarks/coverage.md, which holds the runs so far with what each showed.
bench-coverage: $(VENV)/.bench-installed
	$(PY) -m monet_opt.bench_coverage > docs/benchmarks/coverage_run.md

# Results made late, off and on, on the bench models at their CPU sizes (minutes): writes
# docs/benchmarks/late_grads.md's table.
bench-late: $(VENV)/.bench-installed
	$(PY) -m monet_opt.bench_late

# A smaller last batch and accumulated gradients on ResNet-50 (minutes): writes
# docs/benchmarks/replan.md's "after" table.
bench-replan: $(VENV)/.bench-installed
	$(PY) -m monet_opt.bench_replan

# Our executor's step time against eager's, op by op, on ResNet-50 and BERT-base (minutes):
# writes docs/benchmarks/ops.md.
bench-ops: $(VENV)/.bench-installed
	$(PY) -m monet_opt.bench_ops > docs/benchmarks/ops.md
	$(PY) -m monet_opt.bench_ops --model bert_base --size batch=8,seq=128 --share 0.5 \
		--rounds 15 --top 20 >> docs/benchmarks/ops.md
	$(PY) -m monet_opt.bench_ops --model gpt2_narrow --size batch=4,seq=256 --share 0.333 \
		--rounds 9 --time-limit 30 --top 16 >> docs/benchmarks/ops.md

# The side-by-side benchmark: our frontier beside torch.utils.checkpoint and torch.compile on
# every model (about an hour on 2 idle cores; MONeT's batch sizes when a GPU is present).
# Writes docs/benchmarks/bench.{json,md} and bench_*.png. In pieces:
#   make bench BENCH_ARGS="--models resnet50"   (merges into bench.json)
BENCH_ARGS ?=
bench: $(VENV)/.bench-installed
	$(VENV)/bin/monet-opt bench $(BENCH_ARGS)

# The same on the image models made channels-last (what torch.compile does inside on CPU), with
# eager on the models as built timed beside them: docs/benchmarks/channels_last/.
CL_MODELS ?= googlenet,densenet121,resnet50,mobilenet_v2,vgg16,unet
bench-channels-last: $(VENV)/.bench-installed
	$(VENV)/bin/monet-opt bench --models $(CL_MODELS) --channels-last --out docs/benchmarks/channels_last

$(VENV)/.bench-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@
