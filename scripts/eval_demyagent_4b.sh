#!/usr/bin/env bash
# Re-score the published DemyAgent-4B (the paper's SOTA reference) under our harness.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=Gen-Verse/DemyAgent-4B exec bash scripts/eval_qwen3_4b_cleaner.sh --out out/eval/demyagent-4b.jsonl "$@"
