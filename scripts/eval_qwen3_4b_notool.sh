#!/usr/bin/env bash
# Evaluate the qwen3-4b-notool run as the paper does: temperature 1.0, top_p 0.6, n=16 (LCB n=10), 16 turns,
# SAAR at test time on for AIME/GPQA and off for LCB (--saar paper; --saar both prints both settings).
# GPQA-Diamond and LiveCodeBench files are yours to provide (see data/download.py).
set -euo pipefail
cd "$(dirname "$0")/.."
# --faithful: the official choices; without tools only one of them applies, LiveCodeBench graded by its own harness
python eval.py --model ${MODEL:-out/qwen3-4b-notool/hf} --benchmarks aime24,aime25,gpqa,lcb \
  --n 16 --lcb-n 10 --temperature 1.0 --top-p 0.6 --max-turns 16 --max-new-tokens 20480 --saar paper \
  --faithful --engine sglang --tool-format none \
  --gpqa-path ${GPQA:-data_cache/gpqa_diamond.csv} --lcb-dir ${LCB:-data_cache/livecodebench} \
  --out out/eval/qwen3-4b-notool.jsonl "$@"
