#!/usr/bin/env bash
# Session 7, third call: launch-table sweeps after the fast-SiLU kernels landed. Channel RMS
# (tile, warps) at the Wan VAE shapes; GroupNorm per-pass times (diag_gn_passes.py) and
# apply / statistics warps and tiles at the FLUX / HunyuanVideo VAE shapes.
source benchmarks/device_env.sh
R="wan-vae-out-480p wan-vae-mid-480p"
BUDGET=100 step 90 python3 benchmarks/diag_gn_passes.py flux-vae-out-1024 flux-vae-up1-256 > $OUT/diag.log 2>&1; cat $OUT/diag.log
t() { BUDGET=${B:-560} step 45 env "$@" >> $OUT/sweep.log 2>&1; }
t LAUNCH='{"tile": 8192}' python3 benchmarks/gn_times.py rms8k $R
t LAUNCH='{"tile": 4096}' python3 benchmarks/gn_times.py rms4k $R
t LAUNCH='{"tile": 2048}' python3 benchmarks/gn_times.py rms2k $R
t LAUNCH='{"tile": 4096}' WARPS=2 python3 benchmarks/gn_times.py rms4k-w2 $R
t LAUNCH='{"tile": 4096}' WARPS=8 python3 benchmarks/gn_times.py rms4k-w8 $R
t LAUNCH='{"tile": 8192}' WARPS=4 python3 benchmarks/gn_times.py rms8k-w4 $R
t LAUNCH='{"tile": 2048, "min_bs": 8}' python3 benchmarks/gn_times.py rms2k-bs8 $R
t LAUNCH='{"tile": 1024, "min_bs": 8}' python3 benchmarks/gn_times.py rms1k-bs8 $R
grep " us" $OUT/sweep.log
G="flux-vae-out-1024 flux-vae-up2-512 flux-vae-up1-256 hunyuan-vae-up-9f"
t python3 benchmarks/gn_times.py gn $G
t WARPS=4 python3 benchmarks/gn_times.py gn-w4 $G
t WARPS=16 python3 benchmarks/gn_times.py gn-w16 $G
t STATS_WARPS=4 python3 benchmarks/gn_times.py gn-sw4 $G
t STATS_WARPS=16 python3 benchmarks/gn_times.py gn-sw16 $G
t LAUNCH='{"tile": 4096}' python3 benchmarks/gn_times.py gn4k $G
t LAUNCH='{"tile": 16384}' python3 benchmarks/gn_times.py gn16k $G
t LAUNCH='{"stats_programs": 2048}' python3 benchmarks/gn_times.py gn-sp2k $G
t LAUNCH='{"stats_programs": 512}' python3 benchmarks/gn_times.py gn-sp512 $G
grep " us" $OUT/sweep.log | tail -36
echo "seconds used by the steps: $(( SECONDS - T0 ))"
