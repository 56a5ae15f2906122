#!/usr/bin/env bash
# Session 13, third call: the e2e table again with loop_timer timing each way for 2 s after
# 0.5 s of its own load (the GPU's power-limited clock settles per way: logs/s13/b), and
# with qk_norm_rope's out= a mutating op under compile (joint Q / K rows written in place).
source benchmarks/device_env.sh
BUDGET=570
step 560 python3 -m ditfuse bench --e2e --models flux1-1024,flux2-1024,qwen-image-1328,wan14b-480p --layers 4 --out-dir $OUT/l4 2>&1 | grep -v Warn > $OUT/e2e_l4.log; grep -E "eager|compile|PSNR|psnr| s$" $OUT/e2e_l4.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
