#!/usr/bin/env bash
# Session 17, call e: the Wan 1.3B / 5B fp32 rows out of place with every impl (eager and
# torch.compile too, so that their x compile comes from one run), and `ditfuse check` (the
# main job) on the H200 after the session's changes (Wan / HunyuanVideo / FLUX.2 Q and K out
# of place, the AdaLN table's 8 warps at 6144 channels).
source benchmarks/device_env.sh
BUDGET=400
step 100 python3 -m ditfuse bench --op qk_norm_rope --shapes wan1.3b-480p,wan5b-ti2v-704p --dtypes fp32 --extra-dtypes "" --out-dir $OUT/bench_qk32 > $OUT/bench_qk32.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_qk32.log | tail -2
rm -f $OUT/bench_qk32/*.png
step 200 python3 -m ditfuse check --out $OUT/check_table.txt > $OUT/check.log 2>&1; tail -n 2 $OUT/check.log; grep "| FAIL" $OUT/check_table.txt | cut -c1-200
echo "seconds used by the steps: $(( SECONDS - T0 ))"
