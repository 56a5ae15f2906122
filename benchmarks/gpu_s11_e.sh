#!/usr/bin/env bash
# Session 11, fifth call: the joint-attention models' QK as their processors call it (text and
# image streams, two calls) against one call over the joint sequence; then the e2e table
# (FLUX.1, FLUX.2, Wan 14B at 4 blocks) with the current processors (the table's rows are
# session 5's; Wan's QK calls now take full-width tables made once per step).
source benchmarks/device_env.sh
BUDGET=570
step 60 python3 benchmarks/qk_joint_times.py src 2>&1 | grep -v Warn | tee $OUT/qk_joint.log
step 400 python3 -m ditfuse bench --e2e --models flux1-1024,flux2-1024,wan14b-480p --layers 4 --out-dir $OUT/l4 2>&1 | grep -v Warn > $OUT/e2e_l4.log; grep -E "eager|compile|PSNR|psnr" $OUT/e2e_l4.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
