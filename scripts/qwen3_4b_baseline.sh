#!/usr/bin/env bash
# Qwen3-4B baseline: the same run without SAAR (failed calls stay in the trajectories).
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/qwen3_4b_cleaner.sh --run-name qwen3-4b-baseline --no-saar "$@"
