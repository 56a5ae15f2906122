#!/usr/bin/env bash
# Session 17, call c: (1) bench rows of what changed: HunyuanVideo's qk_norm_rope out of place
# (the patched single-stream call now), the Wan 1.3B / 5B fp32 / fp16 rows (call b's CSV of
# them did not come back); (2) the AdaLN tile kernel at D = 6144 with more tokens (FLUX.2 at
# 2048^2), to see whether 8 warps beat 4 beyond FLUX.2 1024^2; (3) the patched models in CUDA
# graphs (the processors that changed: Wan, HunyuanVideo, FLUX.2); (4) SAME-L end to end fp32
# with session 16's attention entry.
source benchmarks/device_env.sh
BUDGET=570
step 60 python3 -m ditfuse bench --op qk_norm_rope --shapes hunyuan-video-544p --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_hy > $OUT/bench_hy.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_hy.log | tail -1
step 60 python3 -m ditfuse bench --op qk_norm_rope --shapes wan1.3b-480p,wan5b-ti2v-704p --dtypes fp32,fp16 --extra-dtypes "" --impls copy,ditfuse,ditfuse-graph --out-dir $OUT/bench_qk32 > $OUT/bench_qk32.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_qk32.log | tail -4
rm -f $OUT/bench_hy/*.png $OUT/bench_qk32/*.png
step 80 python3 benchmarks/sweep_adaln.py --shapes=flux2-1024,flux2-1024+S=16896,flux2-1024+B=2 1,2 1,4 1,8 > $OUT/sweep_adaln_6144.log 2>&1; grep BEST $OUT/sweep_adaln_6144.log
step 100 python3 -m pytest tests/test_patch_cuda_graph.py tests/test_patch.py -p no:cacheprovider -q --tb=short > $OUT/pytest_patch.log 2>&1; tail -n 3 $OUT/pytest_patch.log
step 250 python3 -m ditfuse bench --e2e --models same-l --dtypes fp32 --out-dir $OUT/e2e_same > $OUT/e2e_same.log 2>&1; grep -E "same-l" $OUT/e2e_same.log | tail -8
rm -f $OUT/e2e_same/*.png
echo "seconds used by the steps: $(( SECONDS - T0 ))"
