#!/usr/bin/env bash
# Session 11: the attention fuzz case that faulted on the H200 (logs/s11/g) and variants
# (logs/s11/h); ARGS="--settings ..." the cases under other launch settings (logs/s11/i).
source benchmarks/device_env.sh
BUDGET=300
which compute-sanitizer; ls /usr/local/cuda*/bin 2>/dev/null | grep -i sanit
step 280 python3 benchmarks/repro_attn_fault.py $ARGS 2>&1 | tee $OUT/repro.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
