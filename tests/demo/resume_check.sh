#!/usr/bin/env bash
# Resuming the U-Net demo on another layout continues the same loss curve.
#   resume_check.sh SHARDRUN DEMO WORKDIR
# Trains 10 steps on a 2x2 mesh (4 ranks), saving the training state after step 4; then
# resumes that state on a 1-D mesh of 3 ranks (another world size, mesh and field layout) and
# trains steps 5-9. Every resumed step's loss must equal the uninterrupted run's in all the 7
# significant digits the demo prints (both runs are float64 and agree to ~1e-14; a lost Adam
# moment or step count moves the loss in the first digits), and the resumed run must still
# match its single-process copy (the demo's own 1e-4 check).
set -euo pipefail
shardrun=$1 demo=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
"$shardrun" -n 4 --timeout 600 "$demo" --mesh 2x2 --steps 10 --checkpoint "$work/ckpt" --save-after 5 \
  --out "$work/uninterrupted" | tee "$work/uninterrupted.log"
"$shardrun" -n 3 --timeout 600 "$demo" --mesh 3 --steps 10 --resume "$work/ckpt" --out "$work/resumed" | tee "$work/resumed.log"
python3 - "$work/uninterrupted.log" "$work/resumed.log" <<'PY'
import re, sys
# A per-step line: "[rank 0]  step  sharded-loss  single-loss  rel  ms  collectives".
step_line = re.compile(r"^\[rank 0\]\s+(\d+)\s+(\S+e[-+]\d+)\s+\S+e[-+]\d+\s")
def losses(path):
    return [(int(m[1]), float(m[2])) for m in map(step_line.match, open(path)) if m]
full = dict(losses(sys.argv[1]))
resumed = losses(sys.argv[2])
steps = [s for s, _ in resumed]
assert steps == list(range(5, 10)), f"the resumed run should train steps 5-9, it printed steps {steps}"
for s, b in resumed:
    a = full[s]
    rel = abs(a - b) / abs(a)
    print(f"step {s}: uninterrupted {a:.12e} resumed {b:.12e} rel {rel:.1e}")
    assert rel <= 1e-6, f"step {s}: the resumed loss {b} leaves the uninterrupted {a} by {rel:.1e} relative"
print("the resumed run continues the uninterrupted loss curve")
PY
