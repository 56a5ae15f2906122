#!/usr/bin/env bash
# Session 14, eighth call: the flat kernel's pair form (qk_norm_rope v10) -- Wan against its
# access pattern, pair form vs the channel form, separate Q / K (diffusers' default) and the
# fused QKV rows; the QK GPU tests.
source benchmarks/device_env.sh
BUDGET=400
cd benchmarks
step 60 python3 wan_pattern.py wan14b-480p wan14b-720p wan1.3b-480p --separate 2>&1 | grep -v Warn | tee $OUT/wan_pattern_sep.log
step 60 python3 wan_pattern.py wan14b-480p wan14b-720p wan1.3b-480p 2>&1 | grep -v Warn | tee $OUT/wan_pattern_fused.log
cd ..
step 240 python3 -m pytest tests/test_qk_flat.py tests/test_qk_fuzz.py tests/test_qk_norm_rope.py tests/test_qk_norm_rope_diffusers.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest_qk.log 2>&1; tail -3 $OUT/pytest_qk.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
