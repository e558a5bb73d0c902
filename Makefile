# Set-up is part of every target: a fresh clone needs only `make demo` or `make test`.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install demo test bench-solvers bench-variants
install: $(VENV)/.installed

# torch 2.14.1 / torchvision 0.29.1 come from this machine's local disk (see research/env.md).
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

demo: install
	$(VENV)/bin/monet-opt demo

test: install
	$(PY) -m pytest -q

# The solver benchmark (minutes): writes docs/benchmarks/solvers.md.
bench-solvers: install
	$(PY) -m monet_opt.bench_solvers > docs/benchmarks/solvers.md

# The operator-variant ablation (minutes): writes docs/benchmarks/variants.md.
bench-variants: install
	$(PY) -m monet_opt.bench_variants > docs/benchmarks/variants.md
