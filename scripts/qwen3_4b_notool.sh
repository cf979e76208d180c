#!/usr/bin/env bash
# Qwen3-4B without tools (the paper's no-tool baseline): plain GRPO, single-turn answers.
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/qwen3_4b_cleaner.sh --run-name qwen3-4b-notool --tool-format none --no-saar --max-turns 1 "$@"
