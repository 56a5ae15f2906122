#!/usr/bin/env bash
# Session 23, first call: (1) Nsight Compute of the shipped attention entries (fp32 one-warp
# tiles at the TensorRT contract shape and SAME-L 8704; bf16 64-query tiles at 8704): is the
# fp32 kernel bound by L2 traffic (its K / V rows are read 3.4 times a stored query)?
# (2) the bf16 entry under a 128-register cap (4 programs a SM); (3) Nsight Compute of
# ditfuse's GELU against PyTorch's at FLUX.1 (eager's F.gelu is faster in the bench).
source benchmarks/device_env.sh
BUDGET=540
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
SECTIONS="--section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables"
KEYS="Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|L2 Hit|L1/TEX Hit|Mem Busy|Max Bandwidth|No Eligible|Stall|Memory Throughput|Block Limit"
for c in "same-l-trt float32" "same-l-8704 float32" "same-l-8704 bfloat16"; do
  set -- $c
  step 90 $NCU --clock-control none --launch-skip 1 --launch-count 1 -k regex:_swa_fwd $SECTIONS \
    python3 benchmarks/profile_attn.py $1 $2 > $OUT/ncu_attn_$1_$2.txt 2>&1
  echo "== $c"; grep -E "$KEYS" $OUT/ncu_attn_$1_$2.txt | head -40
done
step 90 $NCU --clock-control none -k regex:"_act_kernel|gelu" --launch-skip 2 --launch-count 4 $SECTIONS \
  python3 benchmarks/profile_gelu.py > $OUT/ncu_gelu.txt 2>&1
grep -E "^  [a-zA-Z_]|$KEYS" $OUT/ncu_gelu.txt | head -70
step 200 python3 benchmarks/sweep_attention.py --s23 --cases=same-l-8704:bf16,same-l-32946:bf16,same-l-trt:bf16 > $OUT/sweep_s23.log 2>&1
cat $OUT/sweep_s23.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
