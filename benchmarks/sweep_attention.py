"""Launch-settings sweep for sliding_window_attention on the GPU: (BLOCK_M, BLOCK_N,
num_warps, num_stages[, token_major, maxnreg]) at the SAME-L shapes, bf16 and fp32,
CUDA-graph device time (L2 flushed by do_bench). Prints us and % of the byte floor; informs
launch_settings(). Flags pick a config list (--s6 ... --s19b, --s23); --prologue runs SAME's own
call (DyT q/k norm + RoPE fused)."""
import torch

from ditfuse import attention as A
from ditfuse.bench import copy_ceiling_gbps, graph_us
from ditfuse.shapes import ATTN_SHAPES

# (BLOCK_M, BLOCK_N, num_warps, num_stages, token_major): key tiles start at the query
# tile's first key (64 queries at window 17 span 98 keys: 4 x 32, 2 x 64 or 1 x 128)
CONFIGS = [(64, 32, 4, 3, False), (64, 32, 4, 3, True), (64, 32, 4, 2, True),
           (64, 32, 8, 3, True), (64, 64, 4, 2, True), (64, 64, 4, 3, True),
           (64, 64, 8, 2, True), (64, 64, 8, 3, True), (64, 128, 8, 2, True),
           (128, 64, 8, 2, True), (128, 64, 8, 3, True), (128, 32, 8, 3, True)]
import sys  # noqa: E402

if "--s6" in sys.argv:
    # session 6: 16-key tiles (98 keys of a 64-query tile at window 17: 7 x 16 = 112 key
    # slots instead of 4 x 32 = 128; fp32 173 registers instead of 236) and 32-query tiles
    # (mma.sync), against the table
    CONFIGS = [(64, 32, 4, 3, True), (64, 16, 4, 3, True), (64, 16, 4, 4, True),
               (32, 32, 4, 3, True), (32, 16, 4, 3, True), (64, 32, 4, 4, True)]
if "--s7" in sys.argv:
    # session 7: a register cap (6th entry, ptxas .maxnreg) for more programs a SM (bf16 141
    # registers: 3 programs of 4 warps; 128: 4, 8 bytes of spill), fewer stages for fp32
    # (106 KB of shared memory at 3 stages: 2 programs a SM), against the table
    CONFIGS = [(64, 32, 4, 3, True), (64, 32, 4, 3, True, 128), (64, 32, 4, 2, True),
               (64, 32, 4, 2, True, 168), (64, 32, 4, 3, True, 168), (64, 16, 4, 3, True, 128),
               (64, 16, 4, 2, True, 168), (64, 16, 4, 2, True)]
if "--s7b" in sys.argv:
    # session 7, second sweep: the cap's value around 168 (bf16 table tiles), fp32 16-key tiles
    CONFIGS = [(64, 32, 4, 3, True)] + [(64, 32, 4, 3, True, r) for r in (152, 160, 168, 176, 192, 224)] \
        + [(64, 16, 4, 2, True, r) for r in (160, 168, 176, 192)] \
        + [(64, 16, 4, 3, True, r) for r in (168, 192)] + [(64, 32, 4, 2, True, 224)]
if "--s9" in sys.argv:
    # session 9 (run at commit a958bee, whose kernel had a ONE_TILE path, since removed: with
    # BLOCK_M + left + right <= BLOCK_N the band of a query tile in one key tile, each map's
    # softmax in one step, both maps' P @ V into one accumulator): LOST, logs/s9/a. At this
    # tree these settings run the loop kernel
    CONFIGS = [None, (64, 128, 4, 1, True), (64, 128, 4, 2, True), (64, 128, 4, 1, True, 168),
               (64, 128, 8, 1, True), (64, 128, 4, 1, True, 200)]
if "--s16" in sys.argv:
    # prepared in session 15 (not run): small query tiles on mma.sync. A 16-query tile at
    # window 17 needs 50 keys (4 x 16-key tiles: 64 scores a query, where the table's 64-query
    # tile computes 128), one warp a program; sm_90 builds (attn_variants_build.py, bf16):
    # (16, 16, 1, 3) 168 registers, 1288 SASS, no spills; (16, 32, 1, 3) 255, no spills;
    # (32, 32, 2, 3) 250, no spills; in fp32 every one of these spills (4-96 bytes)
    CONFIGS = [None, (16, 16, 1, 3, True), (16, 16, 1, 2, True), (16, 16, 1, 4, True),
               (16, 32, 1, 3, True), (32, 32, 2, 3, True), (32, 16, 2, 3, True),
               (16, 16, 1, 3, True, 128)]
if "--s16b" in sys.argv:
    # session 16: session 15's 16-query tiles ran fp32 20% faster (logs/s16/a: 8704 132.4 vs
    # 166.2 us, the TensorRT contract 74.0 vs 91.5 at (16, 16, 1, 2)) but spill on sm_90 in
    # fp32 (255 registers, 4 / 8 bytes). Two warps a 16-query tile split the key / head_dim
    # columns: sm_90 builds (attn_variants_build.py) fp32 (16, 16, 2, 2) 140 registers,
    # (16, 16, 2, 3) 138, (16, 32, 2, 2) 182, (16, 16, 1, 1) 255, none spills
    CONFIGS = [None, (16, 16, 2, 2, True), (16, 16, 2, 3, True), (16, 32, 2, 2, True),
               (16, 32, 2, 3, True), (16, 16, 1, 1, True), (16, 16, 1, 2, True),
               (16, 16, 2, 4, True), (16, 16, 2, 2, True, 128)]
if "--s17" in sys.argv:
    # session 17: 32 or 64 queries on one or two warps of mma.sync in bf16 (a 32-query tile
    # spans 66 keys at window 17: 5 x 16 = 80 scores a query where the table's 64-query tile
    # computes 128 and a 16-query tile 64; K / V rows read 2.5 times from L2 instead of 4).
    # sm_90 builds (attn_variants_build.py, bf16): (32, 16, 1, 3) 255 registers, no spills,
    # 2152 SASS; (32, 16, 1, 2) 8 / 4 bytes outside the loop; (64, 16, 2, 3) 255, none
    CONFIGS = [None, (32, 16, 1, 3, True), (32, 16, 1, 2, True), (32, 16, 1, 4, True),
               (64, 16, 2, 3, True), (64, 16, 2, 2, True), (16, 16, 1, 3, True)]
if "--s18" in sys.argv:
    # session 18: a program stores fewer queries than its tile holds (the 7th field, step_m)
    # so that its band fits one key tile fewer: 62 of 64 queries span 96 keys at window 17 (3
    # tiles of 32, where 64 queries take 4); 14 of 16 span 48 (3 tiles of 16 instead of 4).
    # sm_90 builds (attn_variants_build.py): bf16 (64, 32, 4, 3, 168, 62) 166 registers, 1424
    # SASS (table 167, 1416); fp32 (16, 16, 1, 2, -, 14) 255 registers, no local memory (the
    # table keeps 4 bytes across its loop)
    CONFIGS = [None, (64, 32, 4, 3, True, 168, 62), (64, 16, 4, 3, True, 168, 62),
               (32, 16, 1, 3, True, None, 30), (16, 16, 1, 3, True, None, 14),
               (16, 16, 1, 2, True, None, 14), (64, 32, 4, 3, True, 168), (16, 16, 1, 2, True)]
if "--s18b" in sys.argv:
    # session 18, after the step went into the table: 128 queries on two warpgroups storing 126
    # (5 key tiles of 32 for 126 queries; sm_90 bf16 build 171 registers, 128 under a cap of
    # 128 with no spills: 2 programs a SM), 32 queries on two warps storing 30 (4 tiles of 16;
    # fp32 182-184 registers, plain 142-145), the table's tile with 2 stages / no cap / cap 160
    CONFIGS = [None, (128, 32, 8, 3, True, 128, 126), (128, 32, 8, 2, True, 128, 126),
               (128, 32, 8, 3, True, None, 126), (32, 16, 2, 2, True, None, 30),
               (32, 16, 2, 3, True, None, 30), (64, 32, 4, 2, True, 168, 62),
               (64, 32, 4, 3, True, None, 62), (64, 32, 4, 3, True, 160, 62),
               (32, 16, 1, 3, True, None, 30)]
if "--s18c" in sys.argv:
    # session 18: fp32 one-warp tiles under a register cap for more programs a SM (255
    # registers: 8 one-warp programs a SM; 224: 9, 200: 10). SAME-L's 8704 x 24 heads in 14-query
    # steps make 14928 programs, 14.1 rounds of 1056, the TensorRT shape 7464 (7.07 rounds).
    # sm_90 builds: the differential 16-query tile at 224 / 200 registers and the plain 32-query
    # tile at 224 / 200 spill nothing (184: 16 B inside the loop)
    CONFIGS = [None, (16, 16, 1, 2, True, 224, 14), (16, 16, 1, 2, True, 200, 14),
               (16, 16, 1, 3, True, 200, 14), (32, 16, 1, 3, True, 224, 30),
               (32, 16, 1, 3, True, 200, 30), (32, 16, 1, 2, True, 200, 30)]
if "--s19" in sys.argv:
    # (prepared in session 18) the query step where it was not measured: SAME's fused prologue
    # entry (with --prologue: 16-key tiles, 62 of 64 queries, 6 key tiles instead of 7)
    # against the same tile storing all 64
    CONFIGS = [None, (64, 16, 4, 3, True, 168, 64), (64, 16, 4, 3, True, 168, 62)]
if "--s19b" in sys.argv:
    # (prepared in session 18) 64-row tiles on 4 warps of mma.sync (the 8th setting,
    # mma_sync: Triton's wgmma switched off while the kernel compiles, _runtime.mma_sync_only):
    # FlashAttention-2's layout, each warp owning 16 query rows with the K / V tiles shared
    # through shared memory, where the table's fp32 entry is one 16-query warp a program. sm_90
    # builds (attn_variants_build.py): fp32 (64, 16, 4, 3, step 62) 183 registers, no spills,
    # 2 programs a SM; (64, 16, 4, 2) 255, capped at 224 no spills; bf16 (64, 16, 4, 3) 160
    # registers, 1144 SASS; (64, 32, 4, 3) 232 (168 capped)
    CONFIGS = [None, (64, 16, 4, 3, True, None, 62, True), (64, 16, 4, 2, True, 224, 62, True),
               (64, 16, 4, 3, True, 168, 62, True), (64, 32, 4, 2, True, None, 62, True),
               (64, 32, 4, 3, True, 168, 62, True), (64, 16, 4, 4, True, None, 62, True)]
if "--s23" in sys.argv:
    # session 23: the bf16 table entry capped at 128 registers: 4 programs a SM (128 x 128 x 4
    # = 64K registers; 4 x 52 KB of shared memory) instead of 3, at the cost of 36 B of spill
    # inside the loop (32 B with 2 stages; sm_90 builds, attn_variants_build.py)
    CONFIGS = [None, (64, 32, 4, 3, True, 128, 62), (64, 32, 4, 2, True, 128, 62),
               (64, 32, 4, 2, True, 168, 62), (64, 16, 4, 3, True, 128, 62)]
if "--s23b" in sys.argv:
    # session 23: multi-warp mma.sync tiles with the warps along the query rows (the 9th
    # field, split_pv: P @ V as two 32-column dots; Triton otherwise splits a [32, 64]
    # product's columns across 2 warps). sm_90 builds (attn_variants_build.py, fp32
    # differential): (32, 16, 2, 3, step 30) 206 registers, (32, 16, 2, 2) 209, under a cap of
    # 168 with 2 stages no spills (6 programs, 12 warps a SM, where the one-warp entry has 8)
    CONFIGS = [None, (32, 16, 2, 3, True, None, 30, False, True),
               (32, 16, 2, 2, True, None, 30, False, True),
               (32, 16, 2, 2, True, 168, 30, False, True),
               (32, 16, 2, 3, True, 168, 30, False, True),
               (32, 16, 2, 3, True, 224, 30, False, True),
               (64, 16, 4, 3, True, None, 62, True, True),
               (32, 16, 2, 4, True, None, 30, False, True)]
if "--s23c" in sys.argv:
    # session 23: 64 query rows on 4 warps of mma.sync, split P @ V, capped at 168 registers
    # (sm_90 fp32 build 164 registers, no spills: 12 warps a SM where uncapped 190 gave 8)
    CONFIGS = [None, (64, 16, 4, 3, True, 168, 62, True, True), (64, 16, 4, 2, True, 168, 62, True, True),
               (64, 32, 4, 3, True, 168, 62, True, True)]
if "--s26" in sys.argv:
    # session 26: after the v10 trims the 16-key differential bf16 build needs 116 registers
    # uncapped with no spill (4 programs of 4 warps a SM where the table's 160 allow 3; 968 SASS
    # against 1160), and the table's tile capped at 128 spills 8 B (2 LDL / STL in the loop;
    # session 23's build spilled 36 B); 96 registers (5 programs) spill 92 B
    CONFIGS = [None, (64, 16, 4, 3, True, None, 62), (64, 16, 4, 2, True, None, 62),
               (64, 16, 4, 4, True, None, 62), (64, 32, 4, 3, True, 128, 62),
               (64, 32, 4, 2, True, 128, 62), (64, 16, 4, 3, True, 96, 62)]
if "--table" in sys.argv:  # the launch table alone (A/B of two source trees)
    CONFIGS = [None]
PROLOGUE = "--prologue" in sys.argv
if PROLOGUE and "--s19" not in sys.argv:
    # (next) SAME's own call: DyT q/k norm + rotate-half RoPE over 32 of 64 channels fused
    # in; the table takes 8 warps / 2 stages there (bf16 168 registers), never swept with a cap
    CONFIGS = [(64, 32, 8, 2, True), (64, 32, 4, 3, True, 168), (64, 32, 4, 2, True, 168),
               (64, 16, 4, 3, True, 168), (64, 32, 8, 2, True, 128), (64, 32, 8, 3, True),
               (64, 32, 4, 3, True)]
ceil = copy_ceiling_gbps()
print(f"copy ceiling {ceil:.0f} GB/s")
CASES = (("same-l-8704", torch.bfloat16), ("same-l-8704", torch.float32),
         ("same-l-trt", torch.float32), ("same-l-32946", torch.bfloat16))
for a in sys.argv:
    if a.startswith("--cases="):  # --cases=same-l-8704:bf16,same-l-8704-plain:fp32
        DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        CASES = [(c.split(":")[0], DT[c.split(":")[1]]) for c in a.split("=", 1)[1].split(",")]
for name, dt in CASES:
    sh = ATTN_SHAPES[name]
    B, N, H, D, w = sh.B, sh.N, sh.H, sh.D, sh.window
    n_in = 5 if sh.differential else 3
    g = torch.Generator(device="cuda").manual_seed(0)
    proj = torch.randn(B, N, n_in * H * D, generator=g, device="cuda").to(dt)
    if sh.differential:
        q1, q2, k1, k2, v = [t.unflatten(-1, (H, D)) for t in proj.chunk(n_in, dim=-1)]
    else:
        (q1, k1, v), q2, k2 = [t.unflatten(-1, (H, D)) for t in proj.chunk(n_in, dim=-1)], None, None
    kw = {}
    if PROLOGUE:
        from ditfuse.norms import NormSpec

        def dyt():
            return NormSpec("dyt", weight=torch.randn(D, generator=g, device="cuda").to(dt) * 0.3 + 1,
                            bias=torch.randn(D, generator=g, device="cuda").to(dt) * 0.1,
                            alpha=torch.full((1,), 0.7, dtype=dt, device="cuda"), eps=None)
        inv = 1.0 / 10000.0 ** (torch.arange(0, 32, 2, device="cuda", dtype=torch.float32) / 32)
        fr = torch.outer(torch.arange(N, device="cuda", dtype=torch.float32), inv)
        fr = torch.cat((fr, fr), -1)
        kw = dict(q_norm=dyt(), k_norm=dyt(), cos=fr.cos(), sin=fr.sin(), rotary_dim=32)
    p = A.plan(q1, k1, v, w, q2=q2, k2=k2, **kw)
    nbytes = (n_in + 1) * B * N * H * D * proj.element_size()
    table = A.launch_settings(D, dt, w, w, N, sh.differential, PROLOGUE)
    ref = A.run(p)
    res = []
    for cfg in CONFIGS:
        try:
            out = A.run(p, cfg)
            err = (out.float() - ref.float()).abs().max().item()
            us = graph_us(lambda cfg=cfg, p=p: A.run(p, cfg))
        except Exception as e:  # noqa: BLE001
            print(f"{name} {dt} {cfg}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        pct = 100 * nbytes / (us * 1e-6) / 1e9 / ceil
        res.append((us, cfg, pct))
        if cfg is None:
            cfg = tuple(table)
        cap = cfg[5] if len(cfg) > 5 else None
        step = cfg[6] if len(cfg) > 6 else None
        mark = " <- table" if tuple(cfg[:4]) == tuple(table[:4]) and cfg[4] and \
            cap == (table[5] if len(table) > 5 else None) and \
            step == (table[6] if len(table) > 6 else None) and \
            bool(cfg[7] if len(cfg) > 7 else False) == bool(table[7] if len(table) > 7
                                                             else False) else ""
        print(f"{name:14s} {str(dt)[6:]:8s} {cfg} {us:8.1f} us {pct:6.1f}% of floor  "
              f"max|d| vs table {err:.2g}{mark}", flush=True)
    best = min(res)
    print(f"BEST {name} {dt}: {best[1]} {best[0]:.1f} us {best[2]:.1f}% (table {table})", flush=True)
