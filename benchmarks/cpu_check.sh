#!/usr/bin/env bash
# One CPU check in one go: what a session runs first on a CPU machine of either maker (an Intel Xeon,
# an AMD EPYC), so that each maker's reproductions, op traces and step figures stand beside the
# other's (issue 60; docs/reproduce.md, docs/bench.md). The steps, in order, each logged:
#   env          the CPU (maker, ISA flags), torch, MKL and oneDNN as the package reads them
#   features     the demo corpus (synth --hours 1.5 --seed 1) and its features, where FEATS has none
#   reproduce_P  `speechperf reproduce P` for tiny, cpu, conformer-cpu, transducer-cpu (seed 1, 2
#                epochs, 1 thread under the cap): identical, differs, or cannot be compared (no
#                curve of this maker)
#   curves_P     (CURVES=1) for each preset whose reproduction found no curve of this maker: its
#                five seeds' first 2 epochs, written to speechperf/config/rcp/P.json (review, commit)
#   op_trace     `benchmarks/run.py op_trace`: where this maker's first training steps part from
#                the other maker's stored traces, op by op
#   mfu ctc dropout lstm_ceiling precision pad_multiple: the CPU step's figures (the ledger's)
#   summary      each step's verdict line in $OUT/summary.md, printed last
# Timing steps want a quiet machine: nothing else running (docs/bench.md).
#
# Usage (repository root, speechperf installed):
#   OUT=/some/dir FEATS=/work/data/features bash benchmarks/cpu_check.sh
#   ... --plan           print each step's command and run nothing (tests/benchmarks/test_cpu_check.py)
# ONLY="reproduce op_trace" runs only the steps whose names start with those words; CURVES=1 makes
# missing curves; PY=python3 by default. Exit status: 0, or 1 when a step failed (the summary names it).
set -uo pipefail
cd "$(dirname "$0")/.."
PLAN=0
for arg in "$@"; do
    case "$arg" in
        --plan) PLAN=1 ;;
        *) echo "cpu_check.sh: unknown argument '$arg' (only --plan)" >&2; exit 2 ;;
    esac
done
OUT=${OUT:?cpu_check.sh: set OUT to the folder for the logs}
FEATS=${FEATS:?cpu_check.sh: set FEATS to the features of the demo corpus (made here when missing)}
PY=${PY:-python3}
PRESETS=(tiny cpu conformer-cpu transducer-cpu)
mkdir -p "$OUT/logs" || exit 2
FAILED=()

wanted() {  # NAME: no ONLY, or a word of ONLY starts it
    [ -z "${ONLY:-}" ] && return 0
    local w
    for w in $ONLY; do [[ "$1" == "$w"* ]] && return 0; done
    return 1
}

# step NAME CMD...: CMD's output in $OUT/logs/NAME.log and its exit status after it; --plan prints CMD
step() {
    local name=$1; shift
    wanted "$name" || return 0
    if [ "$PLAN" = 1 ]; then echo "$name: $*"; return; fi
    echo "== $name"
    local t0=$(date +%s)
    "$@" > "$OUT/logs/$name.log" 2>&1
    local rc=$?
    echo "exit $rc after $(( $(date +%s) - t0 ))s" >> "$OUT/logs/$name.log"
    echo "   exit $rc, $(( $(date +%s) - t0 ))s"
    [ "$rc" = 0 ] || FAILED+=("$name")
}

env_info() {
    lscpu | grep -E "Model name|Vendor ID|^CPU\(s\)|Thread\(s\) per core|Flags"
    "$PY" -c "import torch, json; from speechperf.hardware.isa_cap import effective; print('torch', torch.__version__); print(json.dumps({k: v for k, v in effective().items() if k != 'kernels'}))"
    echo "date $(date -u '+%F %T UTC'), commit $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"
}

features() {
    [ -f "$FEATS/features.json" ] && { echo "features already in $FEATS"; return 0; }
    "$PY" -m speechperf corpus synth "$FEATS-corpus" --hours 1.5 --seed 1 && "$PY" -m speechperf prepare "$FEATS-corpus" "$FEATS"
}

# a reproduction that found no curve of this CPU's maker says so by name (exit 3)
no_curve_here() { grep -q "cpu_vendor" "$OUT/logs/reproduce_$1.log" 2>/dev/null; }

export PY FEATS
export -f env_info features
step env bash -c env_info
step features bash -c features
for p in "${PRESETS[@]}"; do
    step "reproduce_$p" "$PY" -m speechperf reproduce "$p" --data "$FEATS" --wide
done
for p in "${PRESETS[@]}"; do
    if [ "${CURVES:-0}" = 1 ] && { [ "$PLAN" = 1 ] || no_curve_here "$p"; }; then
        step "curves_$p" "$PY" benchmarks/run.py convergence "$p" --seeds 5 --curves 2 --data "$FEATS" \
            --out "$OUT/curves-$p" --write
    fi
done
step op_trace "$PY" benchmarks/run.py op_trace --data "$FEATS"
step mfu "$PY" benchmarks/run.py mfu cpu --data "$FEATS" --precision fp32 bf16
step ctc "$PY" benchmarks/run.py ctc --data "$FEATS" --precision fp32 bf16
step dropout "$PY" benchmarks/run.py dropout --data "$FEATS"
step lstm_ceiling "$PY" benchmarks/run.py lstm_ceiling --data "$FEATS" --rounds 9 --threads 2
step precision "$PY" benchmarks/run.py precision --data "$FEATS"
step pad_multiple "$PY" benchmarks/run.py pad_multiple --data "$FEATS" --preset conformer-cpu

[ "$PLAN" = 1 ] && exit 0
{
    echo "# CPU check $(date -u '+%F %T UTC'), commit $(git rev-parse --short HEAD)"
    for log in "$OUT"/logs/*.log; do
        name=$(basename "$log" .log)
        # a benchmark's ratio line, a reproduction's verdict, else the log's last line before the exit status
        line=$(grep -E "^[a-z_]+: .* = |identical|differs|cannot be compared" "$log" | tail -1)
        echo "- $name: ${line:-$(tail -2 "$log" | head -1)} ($(tail -1 "$log"))"
    done
    [ ${#FAILED[@]} = 0 ] || echo "failed: ${FAILED[*]}"
} > "$OUT/summary.md"
cat "$OUT/summary.md"
[ ${#FAILED[@]} = 0 ]
