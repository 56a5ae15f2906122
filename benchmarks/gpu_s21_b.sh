#!/usr/bin/env bash
# Session 21, second call: where the Wan VAE's channel RMS loses to a copy (rms_probe.py:
# the shipped kernel's access pattern as a plain copy, + the reduction, the full kernel on
# TMA loads / stores), then Nsight Compute of the shipped channel-RMS kernel and of the fp32
# attention kernel at the TensorRT contract shape (stall reasons, occupancy, DRAM / L2).
source benchmarks/device_env.sh
BUDGET=560
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
step 200 python3 benchmarks/rms_probe.py > $OUT/rms_probe.log 2>&1; cat $OUT/rms_probe.log
SECTIONS="--section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables"
step 120 $NCU --clock-control none --launch-skip 1 --launch-count 1 -k regex:_rms_ch_kernel $SECTIONS \
  python3 -c "
import torch, ditfuse
x = torch.randn(1, 96, 4, 480, 832, device='cuda').to(torch.bfloat16)
w = torch.randn(96, 1, 1, 1, device='cuda').to(torch.bfloat16); b = torch.randn_like(w)
for _ in range(3): ditfuse.rms_norm_silu_channels(x, w, b)
torch.cuda.synchronize()" > $OUT/ncu_rms.txt 2>&1
grep -E "Duration|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|Theoretical Occupancy|Issued Warp|Warp Cycles Per Issued|Registers Per|Block Limit|L2 Hit|No Eligible|Stall|Mem Busy|Max Bandwidth" $OUT/ncu_rms.txt | head -40
step 150 $NCU --clock-control none --launch-skip 1 --launch-count 1 -k regex:_swa $SECTIONS \
  python3 benchmarks/profile_attn.py same-l-trt float32 > $OUT/ncu_attn_trt_fp32.txt 2>&1
grep -E "^  _|Duration|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|Theoretical Occupancy|Issued Warp|Warp Cycles Per Issued|Registers Per|Block Limit|L2 Hit|No Eligible|Stall" $OUT/ncu_attn_trt_fp32.txt | head -40
echo "seconds used by the steps: $(( SECONDS - T0 ))"
