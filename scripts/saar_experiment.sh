#!/usr/bin/env bash
# SAAR on vs off on the CPU demo (issue: does SAAR change what the policy learns?): 3 seeds per arm at the
# demo's budget, held-out evaluated with test-time SAAR off (the policy's own tool use) and on; then the
# curves (docs/img/*.png) and the table of final figures. Each run is `python train.py` plus the flags below.
#   bash scripts/saar_experiment.sh                 # 6 runs, ~25 min each on 2 cores
#   SEEDS="0 1" bash scripts/saar_experiment.sh --steps 20
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-"0 1 2"}
runs=()
for seed in $SEEDS; do
  for arm in saar-on saar-off; do
    flag=$([ "$arm" = saar-on ] && echo --saar || echo --no-saar)
    if [ ! -f "out/$arm-s$seed/summary.json" ]; then  # finished runs are kept; rerun by deleting the folder
      python train.py --run-name "$arm-s$seed" --seed "$seed" $flag --eval-saar both "$@"
    fi
    runs+=("out/$arm-s$seed")
  done
done
python scripts/plot_runs.py "${runs[@]}" --out docs/img
