#!/usr/bin/env bash
# Session 5's last device minutes: the Wan VAE channel-RMS kernel with longer contiguous
# runs per channel row (RMS_LONG in sweep_gn.py), against torch.compile in the same run.
source benchmarks/device_env.sh
step 200 python3 benchmarks/sweep_gn.py --rms > $OUT/sweep_rms.log 2>&1; grep -v Warn $OUT/sweep_rms.log | tail -22
echo "seconds used by the steps: $(( SECONDS - T0 ))"
