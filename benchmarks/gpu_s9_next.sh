#!/usr/bin/env bash
# Prepared in session 8 for the next session's first call (not run yet): the SAME-L decode
# end to end with the prologue apart (`ditfuse bench --e2e --models same-l`; session 5's
# table predates it), and the in-place vs out-of-place QK calibration at both Wan-14B
# shapes (the flat kernel lost 3% in place at 480p: calib_qk.py's "in place" row).
source benchmarks/device_env.sh
BUDGET=560
step 360 python3 -m ditfuse bench --e2e --models same-l --out-dir $OUT/e2e_same > $OUT/e2e_same.log 2>&1
grep -vE "^\[|^$" $OUT/e2e_same.log | tail -12
step 120 python3 benchmarks/calib_qk.py wan14b-480p wan14b-720p > $OUT/calib_qk.log 2>&1
grep -E "default|flat 2w" $OUT/calib_qk.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
