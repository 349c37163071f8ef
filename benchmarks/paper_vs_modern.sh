#!/usr/bin/env bash
# The paper's recipe against the modern one on the same GPU, corpus and CER target, in one
# TTA table and one report. Goal on one H100: modern reaches the target in at
# most half the paper's TTA.
#
#   bash benchmarks/paper_vs_modern.sh [OUT] [HOURS]      (TARGET=10 CAP=30 in the env)
#
# paper:  pad to 1670 frames, fp32 (cuDNN may use TF32), AdaDelta   (presets/paper.toml)
# modern: length buckets, bf16, fused AdamW                         (presets/modern.toml)
# Both read losses every SYNC steps (a loop setting, not part of either recipe), so the
# comparison measures the recipes. Finished runs are kept, interrupted ones resumed; delete
# OUT/paper or OUT/modern to measure again. The first run (paper) is the TTA reference.
set -euo pipefail
OUT=${1:-paper_vs_modern}
HOURS=${2:-8}
TARGET=${TARGET:-10}
CAP=${CAP:-30}
SYNC=${SYNC:-25}
sp() { python3 -m speechperf "$@"; }

python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: the comparison is for one GPU')"
sp corpus synth "$OUT/corpus" --hours "$HOURS"
sp prepare "$OUT/corpus" "$OUT/features"
for preset in paper modern; do
  run="$OUT/$preset"
  if [ -f "$run/summary.json" ]; then
    echo "[compare] $run finished: kept"
  elif [ -f "$run/checkpoint.pt" ]; then
    sp train --resume "$run"
  else
    sp train --preset "$preset" --data "$OUT/features" --out "$run" \
      "train.target=$TARGET" "train.time_cap_minutes=$CAP" "train.sync_every=$SYNC"
  fi
done
sp tta "$OUT/paper" "$OUT/modern" --metric cer --targets "$TARGET"
sp report "$OUT/paper" "$OUT/modern" --out "$OUT/report"
