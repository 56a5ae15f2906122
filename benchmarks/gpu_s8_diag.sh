#!/usr/bin/env bash
# Session 8, first call: (1) the Wan QK calibration (plain one-token kernels vs ditfuse's
# per-token and TMA kernels vs a copy of the bytes, benchmarks/calib_qk.py); (2) SAME's own
# attention call (DyT + RoPE prologue) swept with a register cap; (3) Nsight Compute of the
# SAME-L attention kernel and of the Wan QK kernels (stall reasons, occupancy, DRAM).
source benchmarks/device_env.sh
BUDGET=560
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
step 150 python3 benchmarks/calib_qk.py wan14b-480p wan14b-720p > $OUT/calib_qk.log 2>&1
cat $OUT/calib_qk.log
SECTIONS="--section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis"
step 120 $NCU --clock-control none --launch-skip 1 --launch-count 1 -k regex:_swa_fwd $SECTIONS \
  python3 benchmarks/profile_attn.py same-l-8704 bfloat16 > $OUT/ncu_attn.txt 2>&1
grep -E "Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Block Limit|L2 Hit|No Eligible|Stall" $OUT/ncu_attn.txt | head -40
step 150 $NCU --clock-control none -k regex:"_plain_kernel|_qk_norm_rope" --launch-count 24 $SECTIONS \
  python3 benchmarks/calib_qk.py --ncu wan14b-480p > $OUT/ncu_qk.txt 2>&1
grep -E "^  _|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|No Eligible|Warp Cycles Per Issued" $OUT/ncu_qk.txt | head -80
step 240 python3 benchmarks/sweep_attention.py --prologue > $OUT/sweep_attention_prologue.log 2>&1
grep -E "BEST|Error|us " $OUT/sweep_attention_prologue.log | head -60
echo "seconds used by the steps: $(( SECONDS - T0 ))"
