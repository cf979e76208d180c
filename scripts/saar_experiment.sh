#!/usr/bin/env bash
# SAAR on vs off on the CPU demo (does SAAR change what the policy learns?): 3 seeds per arm at the demo's
# budget. Each run is `python train.py --seed N` (the saar-on arm is exactly the demo) or with --no-saar;
# each is then evaluated again with test-time SAAR on, at its warm start and at its end (train.py
# --eval-only), so the held-out set is scored with test-time SAAR off (the policy's own tool use) and on.
# Then the curves ($IMG/*.png, docs/img by default) and the table of final figures.
#   bash scripts/saar_experiment.sh                 # 6 runs of ~20 min on 2 cores, each then evaluated twice (~3 min each):
#                                                   # the runs in docs/results.md (the demo's defaults)
#   TAG=fix0- IMG=docs/img/fix0 bash scripts/saar_experiment.sh --warm-start-fix 0 --steps 11 --train-size 0
#                                                   # the earlier experiment (the demo's earlier cold start, length and data)
# TAG prefixes the run names (out/<TAG>saar-on-s0, ...), IMG is where the curves go.
# A seed's two arms share its cold start and, through --eval-cache, its step-0 evaluation with test-time SAAR off.
#   SEEDS="0 1" bash scripts/saar_experiment.sh --steps 20
# Finished pieces are kept (a run with summary.json, an evaluation already in eval_step*.jsonl); delete a
# folder to redo it.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-"0 1 2"}
TAG=${TAG:-}
IMG=${IMG:-docs/img}
runs=()
for seed in $SEEDS; do
  for arm in saar-on saar-off; do
    run="$TAG$arm-s$seed"
    flag=$([ "$arm" = saar-on ] && echo --saar || echo --no-saar)
    [ -f "out/$run/summary.json" ] || python train.py --run-name "$run" --seed "$seed" $flag "$@"
    grep -q eval_greedy_saar "out/$run/eval_step000000.jsonl" ||
      python train.py --run-name "$run" --eval-only --eval-saar on              # the warm start
    last=$(ls "out/$run"/eval_step*.jsonl | sort | tail -1)
    grep -q eval_greedy_saar "$last" ||
      python train.py --run-name "$run" --eval-only --eval-saar on --resume     # the trained policy
    runs+=("out/$run")
  done
done
python scripts/plot_runs.py "${runs[@]}" --out "$IMG"
