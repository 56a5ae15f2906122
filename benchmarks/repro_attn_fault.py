"""Session 11: the attention fuzz case that faulted on the H200 (case 52 of
tests/test_attention_fuzz.py with DITFUSE_FUZZ_N=100), and variants of it, each in its own
process (a fault ends the CUDA context) with CUDA_LAUNCH_BLOCKING=1. Prints which variants
fail. ``--settings B_M,B_N,WARPS,STAGES ...``: the cases under each launch setting instead
(the table's first). ``--fused``: with the prologue fused (``PROLOGUE_APART`` off; since
session 11 this case runs it apart)."""
import json
import os
import subprocess
import sys

BASE = {'dtype': 'bfloat16', 'B': 2, 'N': 2, 'H': 2, 'D': 128, 'window': 3, 'diff': True,
        'lam': 'float', 'layout': 'bhsd', 'packed': False, 'scale': None, 'norm': 'layer',
        'rope': 'interleaved', 'partial': True, 'unique': False, 'small': False,
        'grad_mode': False, 'seed': 648037912}
VARIANTS = {"case52": {}, "bshd": {"layout": "bshd"}, "plain": {"diff": False},
            "no-norm": {"norm": None}, "no-rope": {"rope": None}, "full-rope": {"partial": False},
            "N70": {"N": 70}, "small-tiles": {"small": True}, "D64": {"D": 64}, "fp32": {"dtype": "float32"},
            "B1": {"B": 1}, "H1": {"H": 1}}

CHILD = r'''
import json, sys, torch
sys.path.insert(0, "tests")
c = json.loads(sys.argv[1]); c["dtype"] = getattr(torch, c["dtype"])
import test_attention_fuzz as T
if sys.argv[3] == "fused":  # the fused prologue, as before session 11's routing
    T.A.PROLOGUE_APART = False
if sys.argv[2]:
    st = T.A.Settings(*[int(v) for v in sys.argv[2].split(",")])
    T.A.launch_settings = lambda *a, **k: st
T.draw = lambda i: c
class MP:
    def setattr(self, obj, name, val): setattr(obj, name, val)
T.test_fuzz_against_fp64_reference(0, MP())
torch.cuda.synchronize()
print("ok")
'''
SETTINGS = [""]
CASES = VARIANTS
if "--settings" in sys.argv:
    SETTINGS = ["64,16,8,2"] + [a for a in sys.argv[sys.argv.index("--settings") + 1:]
                                if not a.startswith("--")]
    CASES = {"case52": {}, "half-dyt": {"rope": "half", "norm": "dyt"}, "fp16": {"dtype": "float16"},
             "N70-bshd": {"N": 70, "layout": "bshd"}, "rms-unique": {"norm": "rms", "unique": True}}
for st in SETTINGS:
    for name, over in CASES.items():
        c = dict(BASE, **over)
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
        fused = "fused" if "--fused" in sys.argv else ""
        r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(c), st, fused], capture_output=True,
                           text=True, env=env, timeout=120)
        tail = (r.stdout + r.stderr).strip().splitlines()
        err = [ln for ln in tail if "Error" in ln or "error" in ln][-1:] if r.returncode else []
        print(f"{st or 'table':10s} {name:12s} rc={r.returncode} {'ok' if r.returncode == 0 else err}",
              flush=True)
        if r.returncode and name == "case52" and not st:
            print("\n".join(tail[-30:]))
