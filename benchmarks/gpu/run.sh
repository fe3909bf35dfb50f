#!/bin/bash
# Every method on CUDA against the CPU, and FedAvg's round time on both, on a GPU machine that
# has PyTorch but nothing else pflarena needs (no network there): the other dependencies
# travel as wheels in .whl/ (Python 3.12, manylinux x86-64), MNIST as .gpudata/mnist/
# mnist-70k.npz. benchmarks/results/gpu.md records what this printed and the commands.
#
#   [DEVICES="cuda cpu"] [BUDGET_S=540] [SKIP_TIMING=1] benchmarks/gpu/run.sh OUT [METHOD ...]
#
# OUT receives env.txt, methods.tsv, progress.txt, fedavg-timing.tsv and logs.tar.gz (every
# run's log). Each method runs 2 rounds on MNIST's CNN, 10 clients, Dirichlet(0.5), seed 0,
# --engine inprocess, once with --device cuda and once with --device cpu.
set -uo pipefail
out=${1:?OUT}; shift
mkdir -p "$out/runs"
if [ -d .whl ] && [ -z "${NO_WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
data=${DATA_DIR:-$PWD/.gpudata}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
    $PY -c "import torch, flwr, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'flwr', flwr.__version__)"
    nproc
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

common=(--dataset mnist --data-dir "$data" --seed 0 --engine inprocess --quiet)

# 1. Every method, CUDA and CPU (6 runs at a time, 4 client workers each).
methods=("$@")
if [ ${#methods[@]} -eq 0 ]; then
    mapfile -t methods < <($PY -m pflarena.cli methods | awk -F'|' 'NR>2 && NF>3 {gsub(/ /,"",$2); print $2}')
fi
one() {
    local method=$1 device=$2 dir=$out/runs/$1-$2 start=$SECONDS
    if [ "$(date +%s)" -gt $((deadline - 120)) ]; then
        echo "$method $device skipped: out of time" | tee -a "$out/progress.txt"
        return
    fi
    timeout 240 $PY -m pflarena.cli run --strategy "$method" "${common[@]}" --num-clients 10 \
        --alpha 0.5 --num-rounds 2 --device "$device" --set validation-fraction=0.2 \
        --set server-fraction=0.1 --workers 4 --output-dir "$dir" > "$dir.log" 2>&1
    echo "$method $device rc=$? $((SECONDS - start))s" | tee -a "$out/progress.txt"
}
deadline=$(($(date +%s) + ${BUDGET_S:-540}))
export -f one; export out PY data deadline; export common_str="${common[*]}"
for method in "${methods[@]}"; do for device in ${DEVICES:-cuda cpu}; do echo "$method $device"; done; done \
    | xargs -P 6 -L 1 bash -c 'common=($common_str); one "$0" "$1"'
$PY - "$out" "${methods[@]}" > "$out/methods.tsv" <<'PYEOF'
import json, sys
from pathlib import Path
out, methods = Path(sys.argv[1]), sys.argv[2:]
def read(m, device):
    try:
        s = json.loads((out / "runs" / f"{m}-{device}" / "summary.json").read_text())
        g = (s.get("global") or {}).get("last", {}).get("mean")
        p = (s.get("personalized") or {}).get("last", {}).get("mean")
        return s["status"], p, g, s["wall_time_s"]
    except Exception as exc:
        return f"failed ({type(exc).__name__})", None, None, None
print("method\tcuda\tcpu\tpersonalized cuda\tpersonalized cpu\tglobal cuda\tglobal cpu\twall cuda s\twall cpu s")
f = lambda v: "" if v is None else f"{v:.4f}"
for m in methods:
    a, b = read(m, "cuda"), read(m, "cpu")
    print(f"{m}\t{a[0]}\t{b[0]}\t{f(a[1])}\t{f(b[1])}\t{f(a[2])}\t{f(b[2])}\t{f(a[3])}\t{f(b[3])}")
PYEOF
cat "$out/methods.tsv"

# 2. FedAvg's round time, GPU against CPU, 100 clients, 10 % and 100 % participation, alone on
# the machine (after the method runs), while the time allows (BUDGET_S, default 540 s, bounds the whole script).
printf 'device\tfraction\trounds\twall_s\trounds_time_s\tpersonalized\tglobal\n' > "$out/fedavg-timing.tsv"
for fraction in ${SKIP_TIMING:+none} 0.1 1.0; do
    [ "$fraction" = none ] && break
    for device in cuda cpu; do
        [ "$(date +%s)" -lt $((deadline - 150)) ] || continue
        dir=$out/runs/fedavg-$device-$fraction
        timeout 150 $PY -m pflarena.cli run --strategy fedavg "${common[@]}" --num-clients 100 \
            --num-rounds 3 --fraction-train $fraction --device $device --output-dir "$dir" \
            > "$dir.log" 2>&1
        $PY - "$dir" "$device" "$fraction" >> "$out/fedavg-timing.tsv" <<'PYEOF'
import json, sys
from pathlib import Path
d, device, fraction = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
try:
    s = json.loads((d / "summary.json").read_text())
    print(f"{device}\t{fraction}\t{s['rounds_completed']}\t{s['wall_time_s']:.2f}\t"
          f"{s['rounds_time_s']:.2f}\t{s['personalized']['last']['mean']:.4f}\t"
          f"{(s.get('global') or {}).get('last', {}).get('mean', float('nan')):.4f}")
except Exception as exc:
    print(f"{device}\t{fraction}\tfailed: {type(exc).__name__}")
PYEOF
    done
done
cat "$out/fedavg-timing.tsv"

tar -czf "$out/logs.tar.gz" -C "$out/runs" $(cd "$out/runs" && ls *.log) 2>/dev/null
rm -rf "$out/runs"
