#!/usr/bin/env bash
export PYTHONPATH=src PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
python3 benchmarks/profile_qk.py wan14b-480p 40 4 sa3-dit 24 4 flux1-1024 24 8 >/dev/null
timeout 300 $NCU --clock-control none --launch-skip 2 --launch-count 1 -k regex:qk_norm_rope \
  --section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis \
  python3 benchmarks/profile_qk.py wan14b-480p 40 4 > $OUT/ncu_wan.txt 2>&1
timeout 200 $NCU --clock-control none --launch-skip 2 --launch-count 1 -k regex:qk_norm_rope \
  --section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats \
  python3 benchmarks/profile_qk.py sa3-dit 24 4 > $OUT/ncu_sa3.txt 2>&1
grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Stall|Warp Cycles Per Issued|Registers Per|Block Limit|Executed Ipc|L1/TEX Hit|L2 Hit|One or More Eligible|No Eligible" $OUT/ncu_wan.txt $OUT/ncu_sa3.txt | head -60
