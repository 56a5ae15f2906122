#!/usr/bin/env bash
# Session 29, call g: Nsight Compute of the fp32 Gluon entry at the TensorRT contract shape
# (the library's launch): occupancy, warp states, and stall samples a SASS instruction --
# where its ~45 us of math (logs/s29/f: diag_nocopy) and the copies' waits go.
source benchmarks/device_env.sh
BUDGET=300
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
SECTIONS="--section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis --section SourceCounters"
step 150 $NCU --clock-control none --launch-skip 1 --launch-count 1 -k regex:_swa_diff_fp32 $SECTIONS \
  --import-source no -o $OUT/ncu_fp32_trt python3 benchmarks/profile_attn.py same-l-trt float32 > $OUT/ncu_run.txt 2>&1; tail -3 $OUT/ncu_run.txt
step 60 $NCU -i $OUT/ncu_fp32_trt.ncu-rep > $OUT/ncu_fp32_trt.txt 2>&1
step 60 $NCU -i $OUT/ncu_fp32_trt.ncu-rep --page source --csv --print-source sass > $OUT/ncu_fp32_trt_sass.csv 2>&1
grep -E "Duration|Throughput|Occupancy|Issue Slots|Warp Cycles Per|No Eligible|Block Limit|Stall|Registers" $OUT/ncu_fp32_trt.txt | head -40
ls -la $OUT
echo "seconds used by the steps: $(( SECONDS - T0 ))"
