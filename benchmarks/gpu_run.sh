#!/usr/bin/env bash
# Run ditfuse on a GPU machine from a copy of this tree (run it from the repository root).
#
#   bash benchmarks/gpu_run.sh                      # ditfuse check, then ditfuse bench
#   bash benchmarks/gpu_run.sh python3 benchmarks/vae_e2e.py --compile
#   OUT=/some/dir bash benchmarks/gpu_run.sh python3 -m pytest -q tests/test_attention_gluon.py
#
# Installs the wheels carried in $WHEELS (default lab/wheels, an ignored folder: e.g. diffusers
# for a machine with no index) when that folder exists, puts src/ on PYTHONPATH, prints the
# environment, runs the command (default: the parity gates, then the benchmark CSV + chart into
# $OUT or benchmarks/results) and tees everything into $OUT/gpu_run.log when $OUT is set.
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
WHEELS=${WHEELS:-lab/wheels}
RESULTS=${OUT:-benchmarks/results}
LOG=${OUT:+$OUT/gpu_run.log}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

run() {
  if [ -d "$WHEELS" ] && compgen -G "$WHEELS/*.whl" > /dev/null; then
    # --no-deps: the machine has their dependencies, and pip may not resolve a carried
    # wheel's newer requirements without an index (importlib_metadata 10 -> lazy-importer)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
      "$WHEELS"/*.whl || return 1
    export PYTHONPATH=/tmp/site:$PYTHONPATH
  fi
  echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "| CUDA", torch.version.cuda,
"| cuDNN", torch.backends.cudnn.version(), "| triton", triton.__version__,
"|", torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")'
  if [ $# -gt 0 ]; then
    "$@"
  else
    local rc=0
    python3 -m ditfuse check ${OUT:+--out "$OUT/check_table.txt"} || rc=$?
    python3 -m ditfuse bench --out-dir "$RESULTS" || rc=$?
    return $rc
  fi
}

if [ -n "$LOG" ]; then
  mkdir -p "$OUT" && run "$@" 2>&1 | tee "$LOG"
else
  run "$@"
fi
