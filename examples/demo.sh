#!/usr/bin/env bash
# The whole elmo-cli pipeline on the demo corpus in examples/ (Jane Austen, public domain):
# vocabulary -> shards -> train the `laptop` recipe -> embeddings -> export -> held-out perplexity beside Kneser-Ney.
# Everything lands in demo-out/ (override with OUT=...). The run has a fixed length (STEPS, on 2 threads), so its
# result does not depend on the machine's speed: the same model on any CPU, in about 7 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ELMO=${ELMO:-.venv/bin/elmo-cli}
OUT=${OUT:-demo-out}
STEPS=${STEPS:-1000}
rm -rf "$OUT"
mkdir -p "$OUT"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. vocabulary from the training text"
$ELMO build-vocab examples/austen_train.txt --output "$OUT/vocab.txt" --projection-dim 128

step "2. character-id shards (training and held-out)"
$ELMO shard examples/austen_train.txt --vocab "$OUT/vocab.txt" --output "$OUT/train" --tokens-per-shard 100000
$ELMO shard examples/austen_heldout.txt --vocab "$OUT/vocab.txt" --output "$OUT/heldout"

step "3. train the biLM: the laptop recipe (Adam, cosine schedule) for $STEPS steps, held-out perplexity every 250"
$ELMO train --preset laptop --data "$OUT/train" --validation "$OUT/heldout" --output "$OUT/run" \
    --max-steps "$STEPS" --validation-every 250 --threads 2

step "4. contextual embeddings of the first 200 held-out sentences (bilm-tf / allennlp layout)"
head -n 200 examples/austen_heldout.txt > "$OUT/heldout-200.txt"
$ELMO dump-embeddings "$OUT/heldout-200.txt" "$OUT/heldout-200.hdf5" --model "$OUT/run"

step "5. export a clean prediction directory (loads in allennlp's Elmo too)"
$ELMO export --model "$OUT/run" --output "$OUT/model"

step "6. held-out perplexity, full softmax, both directions, beside n-gram models of the same training text"
$ELMO evaluate --model "$OUT/model" examples/austen_heldout.txt --threads 2 \
    --baseline kn --baseline unigram --baseline-train examples/austen_train.txt
cat <<EOF_NOTE

"biLM / KN5" above is the biLM's held-out perplexity over that of a 5-gram Kneser-Ney model of the same 205k
training words: below 1, the neural model predicts unseen text better than the classic n-gram model. The training
curve is in $OUT/run/curves.png. With a larger corpus and an hour (\`--preset laptop --max-time 1h\`) the gap
widens; docs/benchmarks.md has the figures.
EOF_NOTE
