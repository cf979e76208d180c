#!/usr/bin/env bash
# Qwen3-4B CLEANER (the paper's main run): GRPO + SAAR on every trajectory, 4 GPUs, one node, each rank with a
# colocated SGLang engine. Run it in SGLang's environment (bash scripts/sglang_env.sh .venv-sglang, then
# . .venv-sglang/bin/activate); --engine hf appended rolls out with transformers instead. The last line holds
# the settings that only make sense on a GPU node (fp16, gradient checkpointing): a CPU run overrides them.
# --faithful: the official code's choices where ours differ (config.py FAITHFUL; docs/departures.md): veRL's
# loss aggregation and warmup, the tool's echo of a final expression and its success/failure header, json_repair
# for calls, a 30-call cap that only stops SAAR, the strict boxed-answer reward, the similarity on the call as
# generated to the end of the turn, and prompts over 2560 tokens dropped.
# Data: python data/download.py --sets open_agentrl,aime24,aime25 --out data_cache
# The official prompt wording: add --templates to that command, then append
# --prompt-template data_cache/prompts/official_train.json (eval.py: official_eval.json)
set -euo pipefail
cd "$(dirname "$0")/.."
NPROC=${NPROC:-4}
torchrun --nproc_per_node="$NPROC" train.py \
  --run-name qwen3-4b-cleaner --model Gen-Verse/Qwen3-4B-RA-SFT --tool-format hermes \
  --train-data data_cache/open_agentrl_30k.jsonl --train-size 0 \
  --eval-data aime25 --eval-size 30 --eval-saar on --eval-sampled \
  --prompts-per-step 128 --samples-per-prompt 16 --mini-batch-prompts 32 \
  --max-turns 16 --max-response-tokens 20480 --overlong-buffer 4096 --overlong-penalty 1.0 \
  --temperature 1.0 --top-p 1.0 --lr 2e-6 --warmup-steps 20 --weight-decay 0.01 --train-layers 0 \
  --clip-low 0.2 --clip-high 0.28 --dual-clip-c 10 --kl-coef 0 --faithful \
  --saar --rollback-p 1.0 --gamma 0.5 --max-retries 3 --max-tool-calls 30 --tool-output-chars 256 \
  --tool-timeout-s 4 --sandbox-slots 16 --max-tokens-per-micro 23040 --engine sglang \
  --steps 235 --eval-every 10 --save-every 10 \
  --device cuda --dtype float16 --update-dtype float16 --gradient-checkpointing "$@"
