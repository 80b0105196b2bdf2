#!/usr/bin/env bash
# Task heads and baselines on UD English EWT with the demo biLM: UPOS tagging and proper-name spans (every run of
# PROPN tokens as one BIO span: examples/ewt/name_spans.py), each with the softmax and the CRF head, the no-ELMo
# baseline with and without the char-CNN, and the biLM fine-tuned with the task. Same split as demo_task.sh (dev
# less every 10th sentence to train, that tenth to pick the epoch, test to score); seed 0; results in $OUT/heads/.
# About 36 minutes on 2 cores after `make demo` (examples/ewt/task-heads-result.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
ELMO=${ELMO:-.venv/bin/elmo-cli}
OUT=${OUT:-demo-out}
MODEL=${MODEL:-$OUT/model}
[ -d "$MODEL" ] || OUT="$OUT" bash examples/demo.sh
H="$OUT/heads"
rm -rf "$H"
mkdir -p "$H"
step() { printf '\n== %s  (%d:%02d so far)\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)); }

awk 'BEGIN { RS = ""; ORS = "\n\n" } NR % 10 != 0' examples/ewt/en_ewt-ud-dev.conllu > "$H/upos-train.conllu"
awk 'BEGIN { RS = ""; ORS = "\n\n" } NR % 10 == 0' examples/ewt/en_ewt-ud-dev.conllu > "$H/upos-dev.conllu"
python3 examples/ewt/name_spans.py "$H/upos-train.conllu" > "$H/names-train.conll"
python3 examples/ewt/name_spans.py "$H/upos-dev.conllu" > "$H/names-dev.conll"
python3 examples/ewt/name_spans.py examples/ewt/en_ewt-ud-test.conllu > "$H/names-test.conll"
COMMON=(--model "$MODEL" --lr 0.002 --seed 0 --threads 2)

step "1. names, softmax head: (a) no ELMo, (a+) with char-CNN, (b) top layer, (c) mix"
$ELMO task train --kind tagging --train "$H/names-train.conll" --dev "$H/names-dev.conll" \
    --test "$H/names-test.conll" --output "$H/names-softmax" --compare --char-cnn "${COMMON[@]}"
step "2. names, CRF head: the same arms"
$ELMO task train --kind tagging --train "$H/names-train.conll" --dev "$H/names-dev.conll" \
    --test "$H/names-test.conll" --output "$H/names-crf" --compare --char-cnn --crf "${COMMON[@]}"
step "3. UPOS, CRF head: the same arms"
$ELMO task train --kind tagging --train "$H/upos-train.conllu" --dev "$H/upos-dev.conllu" \
    --test examples/ewt/en_ewt-ud-test.conllu --output "$H/upos-crf" --compare --char-cnn --crf "${COMMON[@]}"
step "4. names, CRF head, char-CNN, ELMo mix with the biLM fine-tuned (at most 15 epochs)"
$ELMO task train --kind tagging --train "$H/names-train.conll" --dev "$H/names-dev.conll" \
    --output "$H/names-crf-tuned" --char-cnn --crf --fine-tune-bilm --epochs 15 "${COMMON[@]}"
$ELMO task evaluate --task "$H/names-crf-tuned" "$H/names-test.conll" --threads 2
step "done"
