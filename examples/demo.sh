#!/usr/bin/env bash
# The whole elmo-cli pipeline on the demo corpus in examples/ (Jane Austen, public domain):
# vocabulary -> shards -> train a biLM with the `laptop` recipe -> embeddings -> export -> held-out perplexity
# beside Kneser-Ney. Everything lands in demo-out/ (override with OUT=...). The run's length is fixed in steps on 2
# threads, so a busy machine takes longer but trains the same model; one run's whole output, with its machine and
# time, is examples/demo-result.txt. The closing lines print what this run measured, read from its own files.
set -euo pipefail
cd "$(dirname "$0")/.."
ELMO=${ELMO:-.venv/bin/elmo-cli}
OUT=${OUT:-demo-out}
STEPS=${STEPS:-1600}  # training steps of 640 tokens: 1600 are 5 epochs of the 205k-token training text
rm -rf "$OUT"
mkdir -p "$OUT"

if [ -t 1 ]; then BOLD=$'\033[1m' PLAIN=$'\033[0m'; else BOLD= PLAIN=; fi  # bold headings on a terminal only
step() { printf '\n%s== %s%s  (%d:%02d so far)\n' "$BOLD" "$*" "$PLAIN" $((SECONDS / 60)) $((SECONDS % 60)); }

step "1. vocabulary from the training text"
$ELMO build-vocab examples/austen_train.txt --output "$OUT/vocab.txt" --projection-dim 128

step "2. character-id shards (training and held-out)"
$ELMO shard examples/austen_train.txt --vocab "$OUT/vocab.txt" --output "$OUT/train" --tokens-per-shard 100000
$ELMO shard examples/austen_heldout.txt --vocab "$OUT/vocab.txt" --output "$OUT/heldout"

# `laptop` (elmo_cli/presets.py): Adam with a short warmup and a cosine decay laid over the run. The run is fixed
# at $STEPS steps instead of the preset's one-hour time budget (--max-time 0: no time limit) and on 2 threads, so the
# schedule, the model and every number below do not depend on how fast or busy the machine is. Each validation
# (full softmax over the 21k held-out tokens, and curves.png redrawn) costs about 3.5 s.
step "3. train the biLM: the laptop recipe for $STEPS steps, held-out perplexity beside KN5 every 200 steps"
$ELMO train --preset laptop --data "$OUT/train" --validation "$OUT/heldout" --output "$OUT/run" \
    --max-steps "$STEPS" --max-time 0 --threads 2 --validation-every 200

step "4. contextual embeddings of the first 200 held-out sentences (bilm-tf / allennlp layout)"
head -n 200 examples/austen_heldout.txt > "$OUT/heldout-200.txt"
$ELMO dump-embeddings "$OUT/heldout-200.txt" "$OUT/heldout-200.hdf5" --model "$OUT/run"

step "5. export a clean prediction directory (loads in allennlp's Elmo too)"
$ELMO export --model "$OUT/run" --output "$OUT/model"

step "6. held-out perplexity, full softmax, both directions, beside n-gram models of the same training text"
$ELMO evaluate --model "$OUT/model" examples/austen_heldout.txt \
    --baseline kn --baseline unigram --baseline-train examples/austen_train.txt
cat <<EOF_NOTE

biLM / KN5 (the line under the table) is the biLM's held-out perplexity over that of a 5-gram Kneser-Ney model of the
same training text, on the same held-out text (the start of Emma, a novel neither saw): below 1, the biLM predicts
unseen text better than the n-gram model. It is still a small model of 205k tokens of one author: enough to try the
commands with (\`make demo-task\` puts it in a tagger and a classifier), not one for your own tasks. The training
curve is in $OUT/run/curves.png. For your own corpus (0.5-10M tokens on a CPU), train \`--preset auto\` or
\`--preset laptop\` to a time budget (\`--max-time\`); docs/auto.md has what they reach.

What this run measured (from $OUT/run/metrics.jsonl):
EOF_NOTE
# Every figure below comes from this run's own records, none from a stored result.
"${PYTHON:-python3}" - "$OUT/run/metrics.jsonl" "$SECONDS" <<'EOF_PY'
import json
import sys

records = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8") if line.strip()]
checks = [r for r in records if r.get("kind") == "validation" and r.get("baseline_average_perplexity")]
ratio = {r["step"]: r["average_perplexity"] / r["baseline_average_perplexity"] for r in checks}
best = min(checks, key=lambda r: r["average_perplexity"])
past = next((step for step, x in ratio.items() if x < 1), None)
rates = sorted(r["tokens_per_s"] for r in records if r.get("kind") == "train" and r.get("tokens_per_s"))
seconds = int(sys.argv[2])
print(f"  biLM/KN5 by validation: " + ", ".join(f"{x:.3f} (step {step:,})" for step, x in ratio.items()))
print(f"  best: {ratio[best['step']]:.3f} at step {best['step']:,} (held-out perplexity {best['average_perplexity']:.2f} "
      f"against KN5 {best['baseline_average_perplexity']:.2f}); the model files are that step's")
print(f"  " + (f"past Kneser-Ney from step {past:,}" if past is not None else "not past Kneser-Ney yet"))
if rates:
    print(f"  training: {rates[len(rates) // 2]:,.0f} tokens/s (median); the whole demo: {seconds // 60} min {seconds % 60} s")
EOF_PY
