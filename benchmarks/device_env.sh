# Sourced by the device scripts (run on the GPU machine from the repository root): installs
# the carried wheels (.whl: diffusers, liger-kernel, importlib_metadata) into /tmp/site, puts
# them and src/ on PYTHONPATH, and defines step SECONDS CMD...: run CMD for at most SECONDS,
# less if what remains of BUDGET seconds (default 570) is nearly spent.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/src || exit 1
export PYTHONUNBUFFERED=1
T0=$SECONDS
step() {
  local t=$1 l=$(( ${BUDGET:-570} - (SECONDS - T0) )); shift
  if (( l < 15 )); then echo "skipped (budget): $*"; return; fi
  (( t > l )) && t=$l
  timeout "$t" "$@"
}
