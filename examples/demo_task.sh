#!/usr/bin/env bash
# ELMo in task models, the paper's recipe as one command per task: a frozen biLM, a learned layer mix, a BiLSTM.
# Data: UD English EWT (examples/ewt/, CC BY-SA 4.0). Each task trains on the dev part less every 10th sentence,
# picks its best epoch on that tenth, and is scored on the test part; `--compare` trains (a) no ELMo, (b) the top
# layer, (c) the learned mix, (d) the mix at input and output, on the same data and seed. Each arm trains until
# its dev metric has not improved for 5 epochs (`--patience`) and keeps its best epoch.
# The biLM is the demo's (made by examples/demo.sh when $OUT/model is missing); MODEL=DIR uses another one.
set -euo pipefail
cd "$(dirname "$0")/.."
ELMO=${ELMO:-.venv/bin/elmo-cli}
OUT=${OUT:-demo-out}
MODEL=${MODEL:-$OUT/model}
[ -d "$MODEL" ] || OUT="$OUT" bash examples/demo.sh
TASK="$OUT/task"
rm -rf "$TASK"
mkdir -p "$TASK"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# Every 10th sentence of dev (a CoNLL-U paragraph, or a TSV line) is held out for picking the epoch.
awk 'BEGIN { RS = ""; ORS = "\n\n" } NR % 10 != 0' examples/ewt/en_ewt-ud-dev.conllu > "$TASK/upos-train.conllu"
awk 'BEGIN { RS = ""; ORS = "\n\n" } NR % 10 == 0' examples/ewt/en_ewt-ud-dev.conllu > "$TASK/upos-dev.conllu"
awk 'NR % 10 != 0' examples/ewt/genre-dev.tsv > "$TASK/genre-train.tsv"
awk 'NR % 10 == 0' examples/ewt/genre-dev.tsv > "$TASK/genre-dev.tsv"

step "1. UPOS tagging (17 tags), token accuracy on EWT test"
$ELMO task train --kind tagging --train "$TASK/upos-train.conllu" --dev "$TASK/upos-dev.conllu" \
    --test examples/ewt/en_ewt-ud-test.conllu --model "$MODEL" --output "$TASK/upos" \
    --compare --elmo-output --lr 0.002 --seed 0 --threads 2

step "2. genre of a sentence (answers, email, newsgroup, reviews, weblog), accuracy on EWT test"
$ELMO task train --kind classification --train "$TASK/genre-train.tsv" --dev "$TASK/genre-dev.tsv" \
    --test examples/ewt/genre-test.tsv --model "$MODEL" --output "$TASK/genre" \
    --compare --elmo-output --lr 0.002 --seed 0 --threads 2
