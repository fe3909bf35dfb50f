#!/bin/bash
# The GPU checks, on a GPU machine that has Python and PyTorch but nothing else pflarena needs
# and no network: benchmarks/gpu/prepare.sh (run on a machine with network) puts the other
# dependencies as wheels in .whl/ and MNIST in .gpudata/mnist/; both travel with the tree.
# benchmarks/results/gpu.md records what this printed and the commands.
#
#   [BUDGET_S=470] [COMMIT=abc1234] [SKIP="timing methods paper"] [DEVICES="cuda cpu"] \
#       benchmarks/gpu/run.sh OUT [METHOD ...]
#
# Three parts, in this order (the first measures, so it runs alone on the machine), each
# skipped once BUDGET_S (the whole script's bound) would be passed:
#   1. timing:  FedAvg, 100 clients, 10 % and 100 % taking part, 1 round: seconds per round
#               on the GPU with 1, 2 and 4 in-process workers, and on the CPU (one worker per
#               core, the default) -> fedavg-timing.tsv
#   2. methods: every method (or METHOD ...), 2 rounds on MNIST's CNN, 100 clients of which
#               10 % train each round (a tenth of the samples of 10 clients all taking
#               part, so that all 31 fit), Dirichlet(0.5), seed 0, 4 workers, --device cuda
#               and --device cpu, 6 runs at a time -> methods.tsv (and the largest accuracy
#               difference)
#   3. paper:   pFedSV's MNIST setting (preset pfedsv-mnist-dirichlet, E = 5) beside FedFomo
#               and FedAvg on the same federation, on the GPU, as many rounds as the time
#               left allows -> paper.tsv
# OUT also receives env.txt, progress.txt and logs.tar.gz (every run's log).
set -uo pipefail
out=${1:?OUT}; shift
mkdir -p "$out/runs"
start=$(date +%s)
deadline=$((start + ${BUDGET_S:-470}))
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
skip=" ${SKIP:-} "
left() { echo $((deadline - $(date +%s))); }

{
    echo "commit ${COMMIT:-unknown}, $(date -u '+%Y-%m-%d %H:%M UTC')"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
    $PY -c "import torch, flwr, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'flwr', flwr.__version__)"
    echo "cores $(nproc)"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

common=(--dataset mnist --data-dir "$data" --seed 0 --engine inprocess --quiet)
summary_row() {  # DIR LABEL...: one TSV row from a run's summary.json
    $PY - "$@" <<'PYEOF'
import json, sys
from pathlib import Path
d, labels = Path(sys.argv[1]), sys.argv[2:]
try:
    s = json.loads((d / "summary.json").read_text())
    rounds = max(1, s.get("rounds_completed") or 0)
    per_round = s["rounds_time_s"] / rounds
    p = (s.get("personalized") or {}).get("last", {}).get("mean", float("nan"))
    g = (s.get("global") or {}).get("last", {}).get("mean", float("nan"))
    print("\t".join([*labels, s["status"], str(s.get("rounds_completed")),
                     f"{s['wall_time_s']:.1f}", f"{per_round:.2f}", f"{p:.4f}", f"{g:.4f}"]))
except Exception as exc:
    print("\t".join([*labels, f"failed ({type(exc).__name__})", "", "", "", "", ""]))
PYEOF
}

# 1. FedAvg's seconds per round: the GPU with 1, 2, 4 workers against the CPU.
if [[ $skip != *" timing "* ]]; then
    printf 'device\tworkers\tfraction\tstatus\trounds\twall_s\ts_per_round\tpersonalized\tglobal\n' \
        > "$out/fedavg-timing.tsv"
    for fraction in 0.1 1.0; do
        for setting in cuda:1 cuda:2 cuda:4 cpu:default; do
            device=${setting%%:*} workers=${setting##*:}
            [ "$(left)" -gt 200 ] || { echo "timing $setting $fraction skipped: out of time" >> "$out/progress.txt"; continue; }
            dir=$out/runs/fedavg-$device-$workers-$fraction
            flags=(); [ "$workers" = default ] || flags=(--workers "$workers")
            timeout 150 $PY -m pflarena.cli run --strategy fedavg "${common[@]}" --num-clients 100 \
                --num-rounds 1 --fraction-train "$fraction" --device "$device" "${flags[@]}" \
                --output-dir "$dir" > "$dir.log" 2>&1
            summary_row "$dir" "$device" "$workers" "$fraction" >> "$out/fedavg-timing.tsv"
            tail -1 "$out/fedavg-timing.tsv" | tee -a "$out/progress.txt"
        done
    done
fi

# 2. Every method on the GPU and on the CPU.
methods=("$@")
if [ ${#methods[@]} -eq 0 ]; then
    mapfile -t methods < <($PY -m pflarena.cli methods | awk -F'|' 'NR>2 && NF>3 {gsub(/ /,"",$2); print $2}')
fi
one() {
    local method=$1 device=$2 dir=$out/runs/$1-$2
    if [ "$(left)" -lt 120 ]; then
        echo "$method $device skipped: out of time" >> "$out/progress.txt"
        return
    fi
    timeout 150 $PY -m pflarena.cli run --strategy "$method" "${common[@]}" --num-clients 100 \
        --fraction-train 0.1 --alpha 0.5 --num-rounds 2 --device "$device" --workers 4 \
        --set validation-fraction=0.2 --set server-fraction=0.1 --output-dir "$dir" \
        > "$dir.log" 2>&1
    echo "$method $device rc=$?" >> "$out/progress.txt"
}
if [[ $skip != *" methods "* ]]; then
    export -f one left; export out PY data deadline; export common_str="${common[*]}"
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
largest = (0.0, "")
for m in methods:
    a, b = read(m, "cuda"), read(m, "cpu")
    for i in (1, 2):
        if a[i] is not None and b[i] is not None and abs(a[i] - b[i]) > largest[0]:
            largest = (abs(a[i] - b[i]), m)
    print(f"{m}\t{a[0]}\t{b[0]}\t{f(a[1])}\t{f(b[1])}\t{f(a[2])}\t{f(b[2])}\t{f(a[3])}\t{f(b[3])}")
print(f"# largest accuracy difference, GPU against CPU: {largest[0]:.4f} ({largest[1] or 'none'})")
PYEOF
    cat "$out/methods.tsv"
fi

# 3. pFedSV's MNIST setting beside FedFomo and FedAvg, on the GPU, rounds as time allows.
if [[ $skip != *" paper "* ]] && [ "$(left)" -gt 150 ]; then
    rounds=$(( ($(left) - 60) / 3 / 12 ))  # about 12 s a round each (a guess, bounded below)
    [ "$rounds" -ge 2 ] || rounds=2
    printf 'method\trounds asked\tstatus\trounds\twall_s\ts_per_round\tpersonalized\tglobal\n' \
        > "$out/paper.tsv"
    for method in pfedsv fedfomo fedavg; do
        dir=$out/runs/paper-$method
        limit=$(( $(left) - 20 )); [ "$limit" -gt 30 ] || break
        timeout "$limit" $PY -m pflarena.cli run --preset pfedsv-mnist-dirichlet \
            --strategy "$method" --data-dir "$data" --num-rounds "$rounds" --device cuda \
            --engine inprocess --quiet --output-dir "$dir" > "$dir.log" 2>&1 &
    done
    wait
    for method in pfedsv fedfomo fedavg; do
        summary_row "$out/runs/paper-$method" "$method" "$rounds" >> "$out/paper.tsv"
    done
    cat "$out/paper.tsv"
fi

tar -czf "$out/logs.tar.gz" -C "$out/runs" $(cd "$out/runs" && ls *.log) 2>/dev/null
rm -rf "$out/runs"
echo "done in $(( $(date +%s) - start )) s"
