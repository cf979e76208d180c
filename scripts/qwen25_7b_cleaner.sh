#!/usr/bin/env bash
# Qwen2.5-7B CLEANER: SAAR on 70% of trajectories (curriculum mixing), lr 1e-6.
# The official 7B run trains on a pass-rate-filtered subset of Open-AgentRL-30K.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/qwen3_4b_cleaner.sh --run-name qwen25-7b-cleaner --model Gen-Verse/Qwen2.5-7B-RA-SFT \
  --rollback-p 0.7 --lr 1e-6 "$@"
