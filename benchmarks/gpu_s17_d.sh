#!/usr/bin/env bash
# Session 17, call d: the AdaLN tile table's 8 warps at 6144 channels (tile_settings: at most
# 40 elements a thread at 4 warps) -- (1) fp16 / fp32 swept at FLUX.2 (the sm_90 builds differ:
# fp32 93 registers at 4 warps, 5 programs an SM, against 58 at 8, 4 programs; fp16 72 / 40);
# (2) the AdaLN GPU tests; (3) the FLUX.2 AdaLN bench rows; (4) the randomized attention test.
source benchmarks/device_env.sh
BUDGET=570
for dt in fp16 fp32; do
  step 60 python3 benchmarks/sweep_adaln.py --dtype=$dt --shapes=flux2-1024,flux2-1024+S=16896 1,4 1,8 > $OUT/sweep_adaln_$dt.log 2>&1; grep -E "table|BEST" $OUT/sweep_adaln_$dt.log
done
step 80 python3 -m pytest tests/test_adaln.py -p no:cacheprovider -q --tb=short > $OUT/pytest_adaln.log 2>&1; tail -n 2 $OUT/pytest_adaln.log
step 90 python3 -m ditfuse bench --op adaln --shapes flux2-1024 --dtypes bf16,fp16,fp32 --extra-dtypes "" --out-dir $OUT/bench_adaln > $OUT/bench_adaln.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_adaln.log
rm -f $OUT/bench_adaln/*.png
DITFUSE_FUZZ_N=150 step 220 python3 -m pytest tests/test_attention_fuzz.py -p no:cacheprovider -q --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 2 $OUT/pytest_attn_fuzz.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
