#!/usr/bin/env bash
# The whole elmo-cli pipeline on the demo corpus in examples/ (Jane Austen, public domain):
# vocabulary -> shards -> train the `tiny` biLM -> embeddings -> export -> held-out perplexity beside Kneser-Ney.
# Everything lands in demo-out/ (override with OUT=...). About 5 minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ELMO=${ELMO:-.venv/bin/elmo-cli}
OUT=${OUT:-demo-out}
TRAIN_TIME=${TRAIN_TIME:-10m}
rm -rf "$OUT"
mkdir -p "$OUT"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. vocabulary from the training text"
$ELMO build-vocab examples/austen_train.txt --output "$OUT/vocab.txt" --projection-dim 128

step "2. character-id shards (training and held-out)"
$ELMO shard examples/austen_train.txt --vocab "$OUT/vocab.txt" --output "$OUT/train" --tokens-per-shard 100000
$ELMO shard examples/austen_heldout.txt --vocab "$OUT/vocab.txt" --output "$OUT/heldout"

step "3. train the tiny biLM (2 epochs; at most $TRAIN_TIME, then a checkpoint: rerun with --resume to continue)"
$ELMO train --preset tiny --data "$OUT/train" --validation "$OUT/heldout" --output "$OUT/run" --max-time "$TRAIN_TIME"

step "4. contextual embeddings of the first 200 held-out sentences (bilm-tf / allennlp layout)"
head -n 200 examples/austen_heldout.txt > "$OUT/heldout-200.txt"
$ELMO dump-embeddings "$OUT/heldout-200.txt" "$OUT/heldout-200.hdf5" --model "$OUT/run"

step "5. export a clean prediction directory (loads in allennlp's Elmo too)"
$ELMO export --model "$OUT/run" --output "$OUT/model"

step "6. held-out perplexity, full softmax, both directions, beside n-gram models of the same training text"
$ELMO evaluate --model "$OUT/model" examples/austen_heldout.txt \
    --baseline kn --baseline unigram --baseline-train examples/austen_train.txt
cat <<EOF_NOTE

The demo model trains for about two minutes, so expect it to lose to the 5-gram Kneser-Ney model above (a
biLM/KN5 ratio above 1): it is a check that the pipeline works, not a model to embed with. The training curve is
in $OUT/run/curves.png. \`make bench-quality\` trains the \`laptop\` recipe on all six Austen novels for two
hours and shows where a biLM passes Kneser-Ney.
EOF_NOTE
