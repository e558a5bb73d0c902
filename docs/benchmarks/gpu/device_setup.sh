# Sourced by device_run.sh and next_run.sh, in the checkout's root on a lent GPU machine:
# HiGHS from the carried wheels (.whl), the checkout on the path, $OUT made, the GPU named.
export PYTHONUNBUFFERED=1
python3 -V
ls .whl/*.whl > /dev/null 2>&1 || { echo "no .whl/ carried: download highspy's wheel for this" \
    "Python first (docs/benchmarks/gpu/README.md) and pass carry [\".whl\"]"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,driver_version --format=csv,noheader
