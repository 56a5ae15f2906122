#!/usr/bin/env bash
# Session 13, second call: the SM clock, power and temperature under each of the four e2e
# ways (benchmarks/clock_e2e.py) at FLUX.2 and FLUX.1 (4 blocks; + 8 single).
source benchmarks/device_env.sh
BUDGET=420
nvidia-smi -q -d POWER,CLOCK | grep -E "Power Limit|Max Clocks|SM  |Applications" | head -12 > $OUT/smi.txt
for m in flux2-1024 flux1-1024; do
  step 200 python3 benchmarks/clock_e2e.py $m 4 3 2 2>&1 | grep -v Warn > $OUT/clock_$m.log; tail -9 $OUT/clock_$m.log
done
echo "seconds used by the steps: $(( SECONDS - T0 ))"
