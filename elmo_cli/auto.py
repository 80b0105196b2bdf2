"""`train --preset auto`: the model and recipe for this corpus, this budget and this machine, chosen before step 1.

What it knows: the training tokens and vocabulary size (the shard manifest), the budget (`--max-time`, else
`--epochs` or `--max-steps`), the device and threads, and a throughput probe: a few seconds of real training
steps of each candidate shape on this process (`train.measure_throughput`). The rule:

1. The shapes of `LADDER` are probed from the smallest up. Each gets its expected passes over the corpus in the
   budget, ``epochs = tokens/s x seconds / training tokens``. A larger shape is taken when it still gets
   `MIN_EPOCHS` and either at least `MIN_PASS_SHARE` of the passes of the shape below it, counted before the pass
   cap (5.), so in effect of its speed, or the passes near the cap (`decay_from`, where 4. gives it weight decay) on
   a corpus where 4. gives the smallest shape none (over `SMALLEST_DECAY_MAX_TOKENS`; on less text the smaller shape
   at the cap with decay was level with the larger, or 13-14% ahead of it, so there a smaller shape that reaches the
   cap itself ends the probe); the smallest always qualifies, and the probe stops at the first that does not. A
   larger model learns more per token, but not enough to make up for seeing its text much less often: counted by the
   passes the runs made against `laptop`'s in the same cell, the hours it lost were at 0.511-0.545 of them (bf16,
   three held-out or short cells on Zen 4 and 5) or under 0.45 (fp32: 0.33 an hour on an Intel Xeon, 7.6% behind),
   those it won at 0.555 or more, and the 2-hour cells it won at a lower share it ended near the cap. Until
   2026-12-04 the share was 0.45, on the probes' shares of the wins (0.45-0.51), and it took the larger shape in
   three held-out hours that it lost (Zen 4, Zen 5, an Intel AVX512-BF16 Xeon: 0.9-2.7% behind `laptop`). Where the
   smaller shape reaches the cap, its capped passes are not the measure: an Intel Xeon's 2 hours took 1024/256 at
   0.55 of them (0.41 of the speed, 17.7 passes, short of the cap) and lost to the smaller shape's hour
   (docs/auto.md). Each shape's passes are those of its fastest step, compiled where 8. keeps that: the smaller
   shape's compiled step is weighed against the larger one's. A larger shape its first probe would turn down is read
   once more, just after the smaller shape's eager step is, and weighed at its two reads over the smaller one's two
   (`READ_SPREAD_MAX`: where its own reads are far apart, at the faster; one hour's probe on 2 Zen 3 cores gave
   1024/256 1.6 passes, the next hour's 5.1, which the run then trained at).
2. Where the device computes bf16 natively, bf16 autocast is probed beside fp32 and kept when it is at least
   `BF16_GAIN` times faster (it is for the larger shapes on AVX-512 BF16 CPUs, not for the smallest).
3. Dropout follows the expected epochs of the chosen shape (`DROPOUT_BY_EPOCHS`): a model that sees its corpus a
   few times needs little, one that sees it fifty times needs much, and a larger corpus takes more passes to
   overfit (`dropout_step`: the step from 0.1 comes at 8 passes of 0.2M tokens and about 10 of 1M). Past it a
   larger corpus trains `MIDDLE_DROPOUT` (0.2) for a while (`middle_dropout_end`: none at 0.2M tokens, to 17.5
   passes at 0.96M, growing with the square root of the corpus), then 0.3; the smallest shape keeps at most
   `laptop`'s (`SMALLEST_MAX_DROPOUT`), its 0.4 having lost an hour on the addresses by 4.7% (docs/auto.md).
4. A budget that takes the run near the passes the corpus bears (`decay_from`: `DECAY_CAP_SHARE` of the cap of
   5., and never under `DECAY_FROM_EPOCHS`) trains with AdamW and decoupled weight decay (`WEIGHT_DECAY`): where
   the model has stopped improving (15 passes over 0.2M tokens) it gains 1.4-2.4% of held-out perplexity; where it
   is still improving it holds the run back (19 passes over 0.92M tokens: 4.1% worse at the end). The smallest
   shape gets it only on a corpus up to `SMALLEST_DECAY_MAX_TOKENS`: on 0.92M tokens it held `512/128` back at 19
   passes and at the pass cap alike; the gains at the cap were the smaller shape's on 0.2M tokens and the larger
   shape's on 0.2M to 0.8M.
5. A time budget worth more passes than the corpus bears (`max_epochs`: 12 up to 130k tokens, then growing with
   the square root of its size: 15 at 0.2M) ends the run after that many, with the schedule laid over them: more
   overfit it.
6. The rest is the `laptop` recipe: Adam (AdamW by 4.) with warmup and a cosine decay laid over the budget, batch
   32 (64 and 128 rows train a fifth and a half faster on 2 AVX2 threads in fp32, and lost at equal time), 20-token
   windows, sampled softmax with 1,024 negatives (the full softmax when the vocabulary is smaller). But where 2.
   keeps a shape's bf16 step on a CPU, with a time budget of up to an hour (`CPU_ROWS_MAX_SECONDS`) and no
   `--batch-size`, that step is probed again at `CPU_BF16_ROWS` (64) rows and trains there unless it reads slower,
   and 1. weighs the shapes at those rows: on 2 Zen 5 cores 64 rows won six of the eight pairs run in bf16 (15
   minutes and the hour, three corpora held out; on the KJV's hour they tipped the shape to 1024/256 and won by the
   most) and lost the held-out poems' quarter hour twice: once where the shape tipped on a probe 20% over its run,
   once at dropout 0.3 for 64 rows' 8.0 passes against 0.1 for 32 rows' 6.8 (at 0.1, 64 rows won by 4.8%).
   Where the eager 32-row step already reaches the passes the run stops at (the cap of 5., or `--epochs`), 64 rows
   are not probed: as on a GPU (7.) they would buy no passes, only half the updates (5.4% and 3.5% behind at the
   cap on the `zh` poems and 20% of the WEB).
   A `--batch-size` or `--unroll-steps` given is what the probe trains at, so the passes it counts are the run's.
7. On a GPU with a time budget and no `--batch-size`, each shape's batch rows double from 32 (`ROWS_LADDER`), in
   bf16, while a doubling buys at least `ROWS_GAIN` times the tokens/s and the rows kept do not yet reach the pass
   cap in the budget (past it more rows only end the run sooner, with fewer updates); fp32 is then probed at the
   rows kept and taken unless bf16 is `BF16_GAIN` times faster. There a step at 32 rows waits on kernel launches,
   not arithmetic, and bf16's doublings kept paying after fp32's stopped (an H200: docs/auto.md, "On a GPU").
8. On a CPU with a C++ compiler and a time budget of `COMPILE_FROM_SECONDS` or more, each shape that 1. weighs is
   probed once more eagerly, and where its step is in a dtype of `COMPILE_DTYPES` (bf16: the fp32 step's LSTM
   gradient is written by hand, and compiled it probed under 1.1x wherever probed since: 0.90-1.07x on Zen 3)
   once with its LSTM loops compiled (`training.compile`, elmo_cli/compiled.py; the probe pays the compilation,
   about 2 minutes the first time on a machine and seconds from Inductor's cache after, and the run reuses it),
   and where that is `COMPILE_GAIN` times the better eager rate, eagerly a third time, after it; it is compiled
   when it is still `COMPILE_GAIN` times the best of the eager rates (probes early in a process can read low: an
   Intel Xeon held to AVX2 probed 2,567 tokens/s eager, 2,922 compiled, and trained 3,179 eager; docs/auto.md).
   Where the eager step kept is fp32 on a device with native bf16, the bf16 step is the one probed compiled, when
   its eager rate is at least `BF16_GAIN / COMPILED_GAIN_MAX` of fp32's, and kept at `BF16_GAIN` over fp32 (and
   `COMPILE_GAIN` over eager bf16): on 2 Zen 5 cores the `512/128` bf16 step eager read 0.91x fp32 in one probe
   and 1.34x in another, and compiled 1.51x. A compiled step is timed after `seconds` of untimed steps
   (`train.measure_throughput`): a process's first compiled step runs slow for its first seconds.
   Its passes are then counted at the compiled rate over the budget left. A larger shape whose eager rate already
   falls under 1.'s share of the smaller one's fastest is not compiled: the compiled step gained less for the
   larger shape wherever both were measured. `--no-compile` keeps every step eager.

9. With a time budget, a shape's passes are counted over the seconds that will train it: the budget less the
   probe's own seconds so far (the compilation's among them) and less its validations', each about
   `VALIDATION_OVER_TRAINING` times faster per token than its fp32 eager training step. Validations come every
   `VALIDATION_MINUTES`, or where one is slow as often as keeps them to `VALIDATION_SHARE` of the time (at most a
   third of the budget apart); the run validates at that cadence. A run the pass cap ends spreads its validations
   over the cap's steps instead, as many as half the budget it leaves unspent holds (`CAPPED_SPARE_SHARE`, at most
   `CAPPED_VALIDATIONS_MAX`, training's own twentieth of the steps). Counted over the whole budget, the passes
   expected were up to 17% over those the runs made (docs/auto.md).
10. On a CPU the passes are counted at `SUSTAINED_SHARE` of the probe's rate: a run of minutes trains slower than
   the seconds that were read. Over the saved runs on the corpora the constants were tuned on, the probe read a
   median 1.065x the run's mean rate (`python -m benchmarks.probe_bias`); on the held-out corpora 28 of 59 probes
   were within 10% of their runs as read and 41 at 0.94 of it. On a GPU the probe's rate is counted as read (no
   GPU run has been set beside its probe).
11. On a CPU with a time budget, the run reads its own rate after its first `READ_AFTER_SECONDS` of training
   (`read_own_rate`): the passes it now expects are those made plus that rate, at `SUSTAINED_SHARE`, over the
   seconds left less the validations to come (one validation timed at the probe's estimate scaled by the host's
   pace since, the run's rate over the probe's), and what follows from them is read again: rule 3's dropout,
   rule 4's weight decay (Adam to AdamW or back, the moments kept), rule 5's cap (the run then ends at the cap's
   steps, its validations spread over them, or the clock ends it) and rule 9's cadence. What moved, the run
   trains with from its next step (a checkpoint saved, config.json rewritten; metrics.jsonl keeps an
   ``auto-read`` record). Over the runs saved on 2 Zen 5 cores, a run's first minute at 0.94 read the rest within
   10% in 31 of 38, where the probe's seconds read held-out runs so in 41 of 59 (`python -m benchmarks.probe_bias
   --run-dirs ...`, docs/auto.md); the misses had moved the dropout of 3 runs of 31. On the WEB, a probe run
   beside two busy processes took 0.1 for 3.2 passes; its first minute read 11.4, it moved to 0.3 and ended 0.5%
   behind the undisturbed probe's run, which trained at 0.3 throughout. Shape, rows, dtype and compilation stay
   the probe's; a resumed run, and one with anything of the user's laid over the choice, is not read again.

With `--epochs` or `--max-steps` and no `--max-time`, the shape is the one an hour's budget would get (the
budget of `laptop` and of the measurements in docs/auto.md) and the dropout follows the epochs asked for. With
both, the shape is the time budget's, the passes expected (and the dropout and decay that follow them) are the fewer
of those asked for and those the clock allows, and the pass cap of 5. is the user's. The numbers in this file were
measured; docs/auto.md has the runs behind them.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from elmo_cli.config import ModelConfig
from elmo_cli import machine
from elmo_cli.data import steps_per_epoch
from elmo_cli.distributed import launched_world_size
from elmo_cli.loading import resolve_device
from elmo_cli.presets import MODEL_SHAPES, PRESETS
from elmo_cli.train_config import RunConfig, merge_config
from vocab.errors import ElmoError

MIN_TOKENS = 20_000  # below this a corpus gives no held-out signal worth a biLM: refuse rather than guess
MIN_EPOCHS = 4.0  # a larger shape must still see the corpus this often in the budget
MIN_PASS_SHARE = 0.55  # ... and this share of the next smaller shape's passes (not capped), or near the cap
BF16_GAIN = 1.15  # bf16 autocast is kept when the probe finds it at least this much faster
SQRT_TOKENS_PER_PASS = 30.0  # a time budget buying more than sqrt(tokens)/30 passes ends there (max_epochs)
MIN_CAP_EPOCHS = 12.0  # ... but never below 12 passes
EPOCHS_FOR_SHAPE_WITHOUT_TIME = 3600.0  # --epochs/--max-steps only: the shape an hour would get
# (expected epochs below, dropout): the first row whose bound exceeds the epochs applies; the first bound is that of
# a corpus of DROPOUT_STEP_TOKENS, and grows by DROPOUT_STEP_PER_DOUBLING passes each time the corpus doubles past it
# (dropout_step): 8 passes at 0.2M tokens (0.3 best at 8.8 there), 9.0-9.1 at 0.41-0.43M (0.1 won at 7.5 passes,
# 0.3 at 10.5: docs/auto.md, "Rule 3's step between 0.2M and 0.75M tokens"), 9.9-10.4 at 0.75-1.05M (at 9.5 passes
# 0.1 won the poems by 9.1% and the addresses by 1.9%, and was 0.6% behind on the Spanish Bible, where 0.3 won at
# 10.9-11.5 by 3.7%: docs/auto.md, "Rule 3's step on a larger corpus")
DROPOUT_BY_EPOCHS = ((8.0, 0.1), (25.0, 0.3), (math.inf, 0.4))
DROPOUT_STEP_TOKENS = 200_000
DROPOUT_STEP_PER_DOUBLING = 1.0
# Past the step, up to `middle_dropout_end` passes (growing with the square root of the corpus, none at 0.2M), the
# middle dropout: at fixed passes of the WEB (0.96M tokens, held out; docs/auto.md, "Dropout 0.2 between the
# steps") 0.2 won at 14 passes by 1.4% and 0.3 at 20 by 0.9%; on 45% of it (0.43M) 0.2 won at 10.5 by 1.4%
MIDDLE_DROPOUT = 0.2
# ... but the smallest shape keeps at most `laptop`'s 0.3: 0.4 was measured on 1024/256 (Austen and the KJV, 2 hours
# at 25-29 passes); on 512/128 it ended an hour on the addresses (Zen 5, 28.3 passes expected, 20.9 made) at 0.655
# against laptop's 0.626 right after (the same shape at 0.3, 19.8 passes; docs/auto.md), and 2 hours to the
# 31.9-pass cap on an Intel Xeon level with that shape's hour at 0.3
SMALLEST_MAX_DROPOUT = 0.3
DECAY_FROM_EPOCHS = 12.0  # AdamW with WEIGHT_DECAY from this many expected passes at least; Adam below
DECAY_CAP_SHARE = 0.8  # ... and from this share of the corpus's pass cap (max_epochs)
WEIGHT_DECAY = 0.2
# ... but for the smallest shape only on a corpus up to this size: 512/128 gained by decay at its plateau on
# 0.2M tokens (15 passes) and lost by it on 0.92M (19 passes: 4.1% at the end; at the 31.9-pass cap far behind
# at 48 minutes); the bound between the two, the geometric middle, is not measured
SMALLEST_DECAY_MAX_TOKENS = 430_000
# Rule 7 (a GPU's rows): a doubling that buys ROWS_GAIN more text a second at a quarter fewer updates. At equal time
# on the CPU (docs/auto.md, "Batch rows at equal time"), 64 rows' text was worth 0.79 of 32 rows' (break-even at
# 1.27x) and 128 rows' 0.47 (1.46x a doubling), read off 32 rows' own curve, after under 3,000 updates, where larger
# batches cost the most. 2 CPU threads bought 1.19x a doubling in fp32 (AVX2), so a CPU keeps the recipe's 32 in fp32.
ROWS_LADDER = (32, 64, 128, 256, 512, 1024)
ROWS_GAIN = 1.5
# Rule 6's exception (a CPU's rows in bf16): where rule 2 keeps a shape's bf16 step on a CPU, with a time budget up to
# CPU_ROWS_MAX_SECONDS and no --batch-size, the step is probed again at CPU_BF16_ROWS and trains there unless that
# reads slower. On 2 Zen 5 cores (AVX512-BF16) 64 rows ran 1.29-1.36x the tokens/s of 32 for 512/128 in bf16 (1.5x
# for 1024/256's eager probes) and ended 0.8-7.3% lower in six of eight pairs run at 15 and 60 minutes (docs/auto.md,
# "Batch rows at equal time"; the two losses, both on the poems' quarter hour, a tipped shape and rule 3's dropout
# step, which 64 rows' passes crossed: at 0.1 they won by 4.8%); fp32 on AVX2 bought 1.19x and lost. Budgets over an
# hour have not been run at 64 rows on a CPU and keep 32.
CPU_BF16_ROWS = 64
CPU_ROWS_MAX_SECONDS = 3600.0
# Batch rows need this many training sentences each to be spread over sensibly: the base rows' floor (a refusal),
# and the most the GPU ladder and rule 6 may reach.
SENTENCES_PER_ROW = 4
# Rule 8: compiling took about 2 minutes of a fresh process on 2 Zen 1 cores and bought 1.36x (512/128) and 1.16x
# (1024/256): from 20 minutes it pays for itself several times over; under 10% faster it is not worth its time.
COMPILE_FROM_SECONDS = 20 * 60.0
COMPILE_GAIN = 1.1
# ... and only for a step in these dtypes: since 2026-11-28 the fp32 training step on a CPU runs its LSTM loops with
# the gradient written by hand (model.lstm.ClippedLSTMFunction), and no probe compiled it at COMPILE_GAIN after
# that (0.90-1.07x on 2 Zen 3 cores, 0.95x on an Intel AVX512-BF16 Xeon), while its cold compilation cost 104-116 s
# of the budget; bf16 autocast keeps autograd's loop, which compiled at 1.25x (1024/256 on a Zen 4)
COMPILE_DTYPES = ("bf16",)
# ... and where the eager step kept is fp32 on a CPU that computes bf16 natively, the bf16 step is probed compiled
# when its eager rate times this (about what a compiled step gained over its eager one at most: 1.56x and 1.67x
# for 512/128 bf16 on 2 Zen 5 cores, two traces, docs/auto.md) could reach BF16_GAIN over fp32's: from 0.72 of it.
# On those cores the eager bf16 step of 512/128 has read 0.91x to 1.34x the fp32 one in probes of 6 s (kept or not
# by the host's noise) and its compiled step 1.51x fp32's in the same traced probes; on an Intel AVX512-BF16 Xeon
# bf16 ran at 0.6x fp32, and no compilation is probed there (a cold one costs about 2 minutes of the budget)
COMPILED_GAIN_MAX = 1.6
# Rule 9: the validations' minutes are the budget's. One validation (full softmax, fp32, eager, both directions) scores
# its tokens at 1.47x (512/128) and 1.69x (1024/256) the shape's fp32 eager training rate on the addresses' 85,047
# held-out tokens on 2 Zen 4 cores (`bench_probe --validation`, docs/auto.md); 1.4 counts a validation a little long
VALIDATION_OVER_TRAINING = 1.4
VALIDATION_SHARE = 0.035  # the validations' share of a time budget the cadence keeps to, ...
VALIDATION_MINUTES = 10.0  # ... from the recipe's every 10 minutes, stretched to at most a third of the budget
# ... and a run the pass cap ends validates as often as half the budget it leaves unspent holds, at most this often
# (training's own twentieth of the steps): the poems of `zh` peaked at 55-60% of their 12 capped passes, 1.7-2.7%
# under where they ended (docs/auto.md)
CAPPED_VALIDATIONS_MAX = 20
CAPPED_SPARE_SHARE = 0.5
# Rule 1's second read of a larger shape: the larger shape's two 6-s reads over the smaller shape's two, each pair
# adjacent, in place of the faster of its own two reads over the smaller shape's one. On 2 Zen 5 cores, 16 rounds of
# both shapes' bf16 steps at 64 rows on the poems (`bench_probe --pairs`, docs/auto.md) gave the larger shape's speed
# over the smaller's between 0.453 and 0.535 that way (reads of 30 s: 0.488), where the faster read made 0.47 to
# 0.594 and reached the share of 0.55 in 3 rounds of 16 (the poems' quarter hour took 1024/256 so, and lost)
READ_SPREAD_MAX = 1.5  # reads further apart: one is an outlier (440 tokens/s one hour on Zen 3, 1,392 the next)
# On a CPU a run trains at about this share of its probe's rate: 1 / the median probe-over-run ratio of the saved
# `auto` runs on the tuning corpora (1.065 over 9 runs on 2 AMD Zen 5 cores; `python -m benchmarks.probe_bias`,
# docs/auto.md). The host's speed drifts within a run (a quarter in one 10-minute run, under a tenth in the next),
# and a read kept as the faster of two is the higher; a new process reads the step no faster than the one that ran
SUSTAINED_SHARE = 0.94
READ_AFTER_SECONDS = 60.0  # rule 11: the run's own rate, read after this much training
# ... and a run whose passes now expected are over this share of its length (twice the passes its probe expected, at
# least the recipe's 40) is made twice those passes long: the steps would end it before its clock (a probe read
# under a third of the host's pace); short of it, a host that speeds up later still has its margin
READ_LENGTH_SHARE = 2 / 3
PROBE_FRACTION = 0.005  # of the budget, per probed configuration, between the bounds below
PROBE_SECONDS = (1.0, 6.0)


probe_clock = time.monotonic  # what times the probes in `choose`


@dataclass(frozen=True)
class Shape:
    name: str
    model: ModelConfig


LADDER = tuple(Shape(f"LSTM {name}", MODEL_SHAPES[name]) for name in ("512/128", "1024/256"))


@dataclass(frozen=True)
class Facts:
    """What the rule reads before step 1."""

    train_tokens: int
    train_sentences: int
    vocab_size: int
    budget_seconds: float  # --max-time, 0 when the budget is --epochs or --max-steps
    epochs: float | None  # --epochs or --max-steps expressed in epochs, when that is the budget
    threads: int
    device: str  # "cpu", "cuda", ...
    validation_tokens: int = 0
    batch_size: int | None = None  # --batch-size / --unroll-steps when given: the probe trains at those
    unroll_steps: int | None = None
    compile: bool = False  # a CPU with a C++ compiler, and no --no-compile: rule 8 may probe the compiled step
    validation_minutes: float | None = None  # --validation-minutes when given, else rule 9 chooses the cadence
    sustained: float = 1.0  # the share of a probe's rate that a run trains at: `SUSTAINED_SHARE` on a CPU (rule 10)


@dataclass(frozen=True)
class Probe:
    shape: str
    dtype: str
    tokens_per_s: float  # 0.0: the step did not fit in the device's memory
    rows: int = 32
    compiled: bool = False  # the LSTM loops compiled (rule 8)


@dataclass(frozen=True)
class Choice:
    config: RunConfig
    reason: str  # one line for the console and metrics.jsonl (`record`)
    probes: tuple[Probe, ...]
    expected_epochs: float
    shape: str
    tokens_per_s: float  # the chosen shape's, at the chosen dtype, as the probe read it
    probe_seconds: float = 0.0  # wall time of the probe (set by `auto_config`)
    sustained: float = 1.0  # the share of `tokens_per_s` the passes expected were counted at (`Facts.sustained`)
    reread: dict | None = None  # rule 11's facts, where the run reads its own rate (`read_own_rate`)

    def record(self) -> dict:
        """What metrics.jsonl keeps of the choice (its ``{"kind": "auto"}`` record): the line, the passes it
        expects, the probe's seconds and every probe, so a run's speed can be read against what was measured."""
        return {"reason": self.reason, "shape": self.shape, "tokens_per_s": round(self.tokens_per_s, 1),
                "expected_epochs": round(self.expected_epochs, 2), "probe_seconds": round(self.probe_seconds, 1),
                "sustained": self.sustained,
                "probes": [{"shape": p.shape, "dtype": p.dtype, "rows": p.rows, "compiled": p.compiled,
                            "tokens_per_s": round(p.tokens_per_s, 1)} for p in self.probes],
                **({"reread": self.reread} if self.reread else {})}


@dataclass(frozen=True)
class Read:
    """Rule 11's reading of a run's first minute: what the passes it now expects give (rules 3, 4, 5 and 9)."""
    passes: float  # expected over the whole budget, before the cap
    dropout: float  # rule 3's
    weight_decay: float  # rule 4's (0: Adam)
    capped: bool  # rule 5: the passes reach the cap, which ends the run
    epochs: float  # the run's length in passes: the cap, or (the clock ends it) far enough past the passes
    validation_seconds: float  # one validation, the probe's estimate at the host's pace since (rule 9)
    validation_minutes: float  # rule 9's cadence for those seconds
    cap_validations: int  # a capped run's validations over the cap's steps (1: the clock's alone)


def read_own_rate(plan: dict, tokens_done: int, tokens_per_s: float, seconds_left: float) -> Read:
    """Rule 11: what the run's own rate, read after its first minute of training, gives the rules that follow the
    passes: the dropout, the weight decay, the pass cap and the validations' seconds.

    # Parameters
    plan : `Choice.reread` (written by `choose`): the corpus's ``train_tokens``, ``sustained``, the probe's
        ``probe_tokens_per_s`` (the step chosen), ``validation_seconds`` and ``validation_minutes`` (rule 9, with
        ``cadence_given``: the user's), ``budget_seconds``, ``cap`` and ``decay_from`` (rules 5 and 4),
        ``max_dropout`` and ``decays`` (the smallest shape's bounds), ``capped`` and ``epochs`` (the probe's run
        length in passes), ``base_epochs`` (the recipe's), ``expected_epochs`` and ``dropout`` (the probe's).
    tokens_done : tokens trained so far; tokens_per_s : their rate (validations and checkpoints left out);
    seconds_left : of the time budget, on the run's clock.
    """
    pace = plan["probe_tokens_per_s"] / max(tokens_per_s, 1e-9)  # > 1: the host ran the probe slower than the run
    one = plan["validation_seconds"] * pace  # a validation is slowed or sped up as the training step was
    every = plan["validation_minutes"] if plan["cadence_given"] else \
        validation_cadence(one, plan["budget_seconds"])
    left = max(seconds_left, 1.0)
    rate = tokens_per_s * plan["sustained"]
    total = plan["train_tokens"]
    passes = (tokens_done + rate * training_seconds(left, one, every)) / total
    dropout = min(dropout_for(passes, total), plan["max_dropout"])
    cap = plan["cap"]
    capped = passes > cap
    decay = WEIGHT_DECAY if plan["decays"] and min(passes, cap) >= plan["decay_from"] else 0.0
    # The run's length in passes: the cap, or where the clock ends the run, twice the passes expected (at least the
    # recipe's); the probe's stays unless the passes now expected are over `READ_LENGTH_SHARE` of it.
    epochs = cap if capped else plan["epochs"]
    if not capped and (plan["capped"] or passes > READ_LENGTH_SHARE * plan["epochs"]):
        epochs = max(plan["base_epochs"], math.ceil(2 * passes))
    cap_validations = 1
    if capped and one > 0:
        to_cap = max(cap * total - tokens_done, 0) / rate
        spare = left - to_cap - periodic_validations(to_cap, one, every) * one
        cap_validations = capped_validations(spare, one)
    return Read(passes, dropout, decay, capped, epochs, one, every, cap_validations)


def capped_validations(spare: float, one: float) -> int:
    """Rule 9: the validations a run the pass cap ends makes over the cap's steps, as many as `CAPPED_SPARE_SHARE`
    of the `spare` seconds the cap leaves of the budget holds at `one` seconds each (1: its last alone)."""
    return max(1, min(CAPPED_VALIDATIONS_MAX, 1 + math.floor(CAPPED_SPARE_SHARE * spare / one)))


def dropout_step(train_tokens: int) -> float:
    """The expected passes from which rule 3 steps from its lightest dropout to the next: 8 up to 0.2M tokens, one
    more each time the corpus doubles past that (10 at 0.8M). A larger corpus takes more passes to overfit at 0.1:
    on 0.2M tokens 0.3 was best at 8.8 passes; on 0.41-0.43M (45% of the addresses, of the WEB) 0.1 won at 7.5 by
    3-4% and 0.3 at 10.5 by 3-4%; on 0.75M (the Spanish Bible) the two were level at 9.5 and 0.3 won at 10.9-11.5;
    on 1.05M (the poems) 0.1 won at 7.9 and 9.5 passes by 9%."""
    first = DROPOUT_BY_EPOCHS[0][0]
    return round(first + DROPOUT_STEP_PER_DOUBLING * max(0.0, math.log2(train_tokens / DROPOUT_STEP_TOKENS)), 1)


def middle_dropout_end(train_tokens: int) -> float:
    """The expected passes up to which rule 3 trains `MIDDLE_DROPOUT` past `dropout_step`: 8 up to 0.2M tokens (no
    middle band there: 0.3 beat 0.2 at 8.8-9.2 passes), growing with the square root of the corpus past that, as the
    pass cap does (17.5 at 0.96M tokens, where 0.2 won at 14 passes and 0.3 at 20)."""
    first = DROPOUT_BY_EPOCHS[0][0]  # 8 sqrt(x) >= 8 + log2(x) from x = 1: never under the step
    return round(first * math.sqrt(max(train_tokens, DROPOUT_STEP_TOKENS) / DROPOUT_STEP_TOKENS), 1)


def dropout_for(epochs: float, train_tokens: int) -> float:
    """Rule 3's dropout for the passes a run is expected to make over a corpus of `train_tokens`."""
    if epochs < dropout_step(train_tokens):
        return DROPOUT_BY_EPOCHS[0][1]
    if epochs < min(middle_dropout_end(train_tokens), DROPOUT_BY_EPOCHS[1][0]):
        return MIDDLE_DROPOUT
    return next(d for bound, d in DROPOUT_BY_EPOCHS[1:] if epochs < bound)


def max_epochs(train_tokens: int) -> float:
    """The passes a time budget may spend on a corpus before the run ends: more only overfit it. Measured at 32k
    tokens (the biLM peaks near 7 passes there, is flat to 12 and then falls apart) and at 0.2M (the larger shape
    peaks near 12-15 passes, then overfits even with dropout 0.4 and weight decay: 15 passes beat 30); past 12 it
    grows with the square root of the corpus: 12 passes at 32k tokens, 15 at 0.2M, 30 at 0.8M."""
    return max(MIN_CAP_EPOCHS, round(math.sqrt(train_tokens) / SQRT_TOKENS_PER_PASS, 1))


def decay_from(train_tokens: int) -> float:
    """The expected passes from which a run trains with weight decay: 12 up to 0.2M tokens, then 0.8 of the pass
    cap (24 at 0.8M). Decay helped where the model had stopped improving (15 passes over 0.2M tokens, the cap)
    and held back one still improving (19 passes over 0.92M, 0.6 of its cap): docs/auto.md, rule 4."""
    return max(DECAY_FROM_EPOCHS, round(DECAY_CAP_SHARE * max_epochs(train_tokens), 1))


def probe_seconds(budget_seconds: float) -> float:
    lo, hi = PROBE_SECONDS
    return min(max(PROBE_FRACTION * (budget_seconds or EPOCHS_FOR_SHAPE_WITHOUT_TIME), lo), hi)


def validation_cadence(one: float, budget_seconds: float, given: float | None = None) -> float:
    """Rule 9's minutes between validations: the recipe's 10, stretched where one validation takes `one` seconds
    so that they keep to `VALIDATION_SHARE` of the time, but to at most a third of the budget; `given` (the
    user's) wins."""
    if given:
        return given
    stretched = math.ceil(one / VALIDATION_SHARE / 60)  # whole minutes
    return min(max(VALIDATION_MINUTES, stretched), max(VALIDATION_MINUTES, budget_seconds / 180))


def periodic_validations(left: float, one: float, minutes: float) -> int:
    """The validations a run makes in `left` seconds before its clock ends, due every `minutes` after the last one
    ended, `one` seconds each (the run's last validation, after its clock ends, is not among them)."""
    return math.floor(left / (60 * minutes + one)) if one > 0 else 0


def training_seconds(left: float, one: float, minutes: float) -> float:
    """Of `left` seconds of a time budget, those that train: the `periodic_validations` come out."""
    return max(left - periodic_validations(left, one, minutes) * one, 1.0)


def check_facts(facts: Facts, source: str) -> None:
    """The bad inputs `auto` refuses before probing: no budget, too little text, a budget under one validation."""
    if not facts.budget_seconds and not facts.epochs:
        raise ElmoError("--preset auto needs a budget: give --max-time (e.g. 60m), --epochs or --max-steps")
    if facts.train_tokens < MIN_TOKENS:
        raise ElmoError(f"{source}: {facts.train_tokens:,} training tokens is too little text for --preset auto "
                        f"(at least {MIN_TOKENS:,}); a 5-gram Kneser-Ney model is the better model of so little "
                        f"text, and --preset tiny still runs the pipeline")
    rows = _base(facts).training.batch_size
    if facts.train_sentences < SENTENCES_PER_ROW * rows:
        raise ElmoError(f"{source}: {facts.train_sentences:,} sentences cannot be spread over "
                        f"{rows} batch rows sensibly (at least {SENTENCES_PER_ROW * rows}); split the text into one "
                        f"sentence per line{' or give a smaller --batch-size' if facts.batch_size else ''}")


def _base(facts: Facts | None = None) -> RunConfig:
    """The `laptop` recipe, at the user's batch rows and window length where they gave them."""
    config = PRESETS["laptop"].config
    if facts is not None:
        config = config.with_training(batch_size=facts.batch_size, unroll_steps=facts.unroll_steps)
    return config


def choose(facts: Facts, measure: Callable[[RunConfig, float], float], source: str = "--data",
           clock: Callable[[], float] | None = None) -> Choice:
    """Apply the rule (module docstring). ``measure(config, seconds)`` returns training tokens/s of `config`;
    `clock` (default `probe_clock`) times the probes, whose seconds are the budget's (rule 9).

    ``choose(Facts(800_000, 30_000, 10_000, 3600, None, 2, "cpu"), measure)`` -> `Choice` with the config, its
    one-line reason and the probes behind it.
    """
    check_facts(facts, source)
    seconds = probe_seconds(facts.budget_seconds)
    budget = facts.budget_seconds or EPOCHS_FOR_SHAPE_WITHOUT_TIME
    base = _base(facts)
    negatives = min(base.training.n_negative_samples, facts.vocab_size)
    bf16_native = facts.device.startswith("cuda") or machine.cpu_bf16()
    cap = max_epochs(facts.train_tokens)
    probes: list[Probe] = []
    rows_ladder = facts.device.startswith("cuda") and facts.batch_size is None and facts.budget_seconds > 0
    cpu_rows = (not facts.device.startswith("cuda") and bf16_native and facts.batch_size is None
                and 0 < facts.budget_seconds <= CPU_ROWS_MAX_SECONDS
                and SENTENCES_PER_ROW * CPU_BF16_ROWS <= facts.train_sentences)
    stopped: dict[str, str] = {}  # shape name -> why its rows stopped doubling (the GPU ladder)
    clock = clock or probe_clock
    began = clock()
    fp32_rates: dict[str, float] = {}  # shape name -> its fp32 eager tokens/s, which a validation's time follows

    eager_rates: dict[tuple[str, str], float] = {}  # (shape name, dtype) -> its best eager tokens/s so far

    def rate_of(shape: Shape, dtype: str, rows: int) -> float:
        config = _config(base, shape, dtype, negatives, facts.threads)
        rate = measure(config.with_training(batch_size=rows, device=facts.device), seconds)  # the run's device
        probes.append(Probe(shape.name, dtype, rate, rows))
        if dtype == "fp32" and rate > 0:
            fp32_rates[shape.name] = rate
        eager_rates[(shape.name, dtype)] = max(rate, eager_rates.get((shape.name, dtype), 0.0))
        return rate

    def one_validation(shape: Shape, rate: float) -> float:
        """Seconds of one validation of `shape` (rule 9): 0 without a time budget or validation shards."""
        if not facts.budget_seconds or not facts.validation_tokens:
            return 0.0
        return facts.validation_tokens / (VALIDATION_OVER_TRAINING * fp32_rates.get(shape.name, rate))

    def cadence(shape: Shape, rate: float) -> float:
        return validation_cadence(one_validation(shape, rate), facts.budget_seconds, facts.validation_minutes)

    def train_seconds(shape: Shape, rate: float) -> float:
        """The seconds that will train `shape`: with a time budget, what the probes so far and the validations
        leave of it; else the hour's budget rule 1 weighs shapes by."""
        if not facts.budget_seconds:
            return budget
        one = one_validation(shape, rate)
        return training_seconds(max(budget - (clock() - began), 1.0), one, cadence(shape, rate))

    def passes_of(shape: Shape, rate: float) -> float:
        return rate * facts.sustained * train_seconds(shape, rate) / facts.train_tokens

    def fastest(shape: Shape) -> tuple[str, float, int]:
        """(dtype, tokens/s, rows): fp32, or bf16 where it is native and at least BF16_GAIN times faster; on a GPU
        the rows doubled in bf16 while each doubling buys ROWS_GAIN, and fp32 probed at the rows kept; on a CPU
        where bf16 is kept, its step at CPU_BF16_ROWS where that reads no slower (rule 6)."""
        rows = base.training.batch_size
        climb = "bf16" if rows_ladder and bf16_native else "fp32"  # the dtype the rows ladder is climbed in
        best = (climb, rate_of(shape, climb, rows), rows)
        if rows_ladder and best[1] > 0:
            for more in (r for r in ROWS_LADDER if r > rows and SENTENCES_PER_ROW * r <= facts.train_sentences):
                if best[1] * budget / facts.train_tokens >= cap:  # more rows would only end it sooner
                    stopped[shape.name] = f"{best[2]:,} rows already reach the {cap:g}-pass cap"
                    break
                rate = rate_of(shape, climb, more)
                if rate < ROWS_GAIN * best[1]:
                    stopped[shape.name] = (f"{more:,} rows would buy {rate / best[1]:.2f}x (< {ROWS_GAIN:g}x)"
                                           if rate else f"{more:,} rows do not fit in its memory")
                    break
                best = (climb, rate, more)
        if bf16_native and best[1] > 0:
            other = "fp32" if climb == "bf16" else "bf16"
            rate = rate_of(shape, other, best[2])
            fp32, bf16 = (rate, best[1]) if other == "fp32" else (best[1], rate)
            dtype = "bf16" if bf16 >= BF16_GAIN * fp32 else "fp32"
            best = (dtype, bf16 if dtype == "bf16" else fp32, best[2])
        # rule 6's exception, unless the rows kept already reach the passes the run stops at: more rows would only
        # end it sooner, with half the updates (at the cap 64 rows ended 5.4% behind 32 on the `zh` poems, 3.5% on
        # 20% of the WEB: docs/auto.md)
        if (cpu_rows and best[0] == "bf16" and best[2] < CPU_BF16_ROWS
                and passes_of(shape, best[1]) < (facts.epochs or cap)):
            rate = rate_of(shape, "bf16", CPU_BF16_ROWS)
            if rate >= best[1]:
                best = ("bf16", rate, CPU_BF16_ROWS)
        return best

    compile_here = (facts.compile and facts.budget_seconds >= COMPILE_FROM_SECONDS
                    and not facts.device.startswith("cuda"))

    def compiled_dtype(shape: Shape, dtype: str, eager: float) -> str | None:
        """The dtype whose step rule 8 probes compiled beside the eager `dtype` step kept: that dtype where it is
        in `COMPILE_DTYPES`; else, on a device that computes bf16 natively, bf16 where its eager rate could
        reach `BF16_GAIN` over `eager` compiled; else None."""
        if dtype in COMPILE_DTYPES:
            return dtype
        for other in COMPILE_DTYPES:
            if bf16_native and COMPILED_GAIN_MAX * eager_rates.get((shape.name, other), 0.0) >= BF16_GAIN * eager:
                return other
        return None

    def at_best(shape: Shape, dtype: str, rate: float, rows: int) -> tuple[str, float, bool, float, float]:
        """(dtype, tokens/s, compiled, eager tokens/s, seconds the kept compiled probe took) of a shape at its
        fastest step: rule 8's compiled probe, where it applies, beside its eager step probed again just before
        it. The eager tokens/s are those of the eager `dtype` step, which a compiled bf16 step can replace."""
        if not compile_here:
            return dtype, rate, False, rate, 0.0
        config = _config(base, shape, dtype, negatives, facts.threads).with_training(batch_size=rows,
                                                                                      device=facts.device)
        # The eager step again, just before: a process's first probe can read far under its speed (868 tokens/s
        # against a run's 1,500 on 2 Zen 1 cores, docs/auto.md), which would credit the compilation with it.
        again = measure(config, seconds)
        probes.append(Probe(shape.name, dtype, again, rows))  # what this probe read, not the best so far
        eager = max(rate, again)
        target = compiled_dtype(shape, dtype, eager)
        if target is None:  # the step's gradient is written by hand: compiling it does not pay
            return dtype, eager, False, eager, 0.0

        def bar(eager: float) -> float:
            """What the compiled step must reach: COMPILE_GAIN over the eager step, and where it is bf16 in place
            of an fp32 step, BF16_GAIN over that and COMPILE_GAIN over its own eager bf16 step."""
            if target == dtype:
                return COMPILE_GAIN * eager
            return max(BF16_GAIN * eager, COMPILE_GAIN * eager_rates.get((shape.name, target), 0.0))
        start = clock()
        compiled_rate = measure(config.with_training(dtype=target, compile=True), seconds)
        took = clock() - start
        probes.append(Probe(shape.name, target, compiled_rate, rows, compiled=True))
        if compiled_rate >= bar(eager):
            # and after it: both earlier eager probes can read low (2,567 tokens/s twice on an Intel Xeon held to
            # AVX2, whose eager step trained at 3,179 and compiled at 2,916: docs/auto.md)
            after = measure(config, seconds)
            probes.append(Probe(shape.name, dtype, after, rows))
            eager = max(eager, after)
        if compiled_rate >= bar(eager):
            return target, compiled_rate, True, eager, took
        return dtype, eager, False, eager, 0.0

    def short_of_share(shape: Shape, passes: float, compiled: bool) -> str:
        """The line's clause refusing `shape` at `passes` under `MIN_PASS_SHARE` of the shape taken and short of
        the passes near the cap (`decay_from`), else ""."""
        if chosen is None or passes >= near or passes >= MIN_PASS_SHARE * below:
            return ""
        capped = f", and short of the {near:g} near the {cap:g}-pass cap" if below > cap else ""
        return (f"; {shape.name} would get {passes:.1f}{' compiled' if compiled else ''} (< {MIN_PASS_SHARE:g} x "
                f"{chosen[0].name}'s {below:.1f}{capped})")

    def read_again(shape: Shape, dtype: str, rows: int, first: float) -> float:
        """A larger shape's tokens/s from two reads, each beside a read of the smaller shape's eager step (the shape
        taken): that step is read again, then the larger shape, and the larger shape's two reads over the smaller
        one's two give its speed at the smaller one's first read. Where its own two reads are more than
        `READ_SPREAD_MAX` apart, the faster is taken over its neighbour instead (one read can be an outlier:
        1024/256 read 440 tokens/s in one hour's probe on 2 Zen 3 cores and 1,392 in the next)."""
        small, small_dtype, small_rows = chosen[0], chosen[7], chosen[3]
        before = next((p.tokens_per_s for p in reversed(probes) if (p.shape, p.dtype, p.rows, p.compiled) ==
                       (small.name, small_dtype, small_rows, False)), 0.0)
        now = rate_of(small, small_dtype, small_rows)
        before = before or now
        again = rate_of(shape, dtype, rows)
        if now <= 0 or again <= 0:
            return max(first, again)
        if max(first, again) > READ_SPREAD_MAX * min(first, again):
            return max(first, again * before / now)
        return before * (first + again) / (before + now)

    # (shape, dtype, tokens/s, rows, compiled, eager tokens/s, compiling seconds, eager dtype) of the shape taken
    chosen: tuple[Shape, str, float, int, bool, float, float, str] | None = None
    # The passes of the shape taken so far at its fastest step, not capped: the share weighs the shapes' speeds.
    # A larger shape that gets near the cap itself (where rule 4 gives it weight decay) is taken whatever its share.
    below = 0.0
    # On a corpus where the smallest shape trains with weight decay at that cap too (rule 4), a smaller shape that
    # reaches the cap ends the ladder (below), so there the passes near the cap take no larger shape.
    near = decay_from(facts.train_tokens)
    refused = ""
    for shape in LADDER:
        if (chosen is not None and not facts.epochs and facts.train_tokens <= SMALLEST_DECAY_MAX_TOKENS
                and passes_of(chosen[0], chosen[2]) >= cap):
            # Both shapes would train to the cap, and there the smaller one (with weight decay, rule 4) was level
            # with the larger or 13-14% ahead of it on 0.15-0.21M tokens (docs/auto.md, "0.2M tokens"): at equal
            # passes the share of 1. says nothing, and the larger shape is not probed.
            refused = (f"; {shape.name} not weighed: {chosen[0].name} reaches the cap, where on up to "
                       f"{SMALLEST_DECAY_MAX_TOKENS / 1e6:.2f}M tokens it was level or ahead")
            break
        dtype, rate, rows = fastest(shape)
        if chosen is None and rate == 0:
            raise ElmoError(f"--preset auto: a training step of {shape.name} at {rows} batch rows does not fit in "
                            f"the memory of {facts.device} (nothing was written)")
        passes = passes_of(shape, rate)
        if chosen is not None:  # the shape taken, counted over the same seconds left
            below = passes_of(chosen[0], chosen[2])
        if chosen is not None and (passes < MIN_EPOCHS or short_of_share(shape, passes, False)):
            # A shape's first probe can read a third of its speed (1024/256 on 2 Zen 3 cores: 1.6 passes one hour,
            # 5.1 the next, docs/auto.md), and any 6-s read a tenth off: it is read once more, beside the smaller
            # shape's step, before it is turned down.
            rate = read_again(shape, dtype, rows, rate)
            passes = passes_of(shape, rate)
            below = passes_of(chosen[0], chosen[2])
        if chosen is not None and passes < MIN_EPOCHS:
            refused = f"; {shape.name} would get {passes:.1f} (< {MIN_EPOCHS:g})"
            break
        # A larger shape is weighed at its eager rate against the smaller one's fastest first (the compiled step
        # gained less for the larger shape in every measurement), then at its own fastest.
        refused = short_of_share(shape, passes, False)
        if refused:
            break
        eager_dtype = dtype
        dtype, rate, compiled, eager_rate, took = at_best(shape, dtype, rate, rows)
        passes = passes_of(shape, rate)
        if chosen is not None:
            below = passes_of(chosen[0], chosen[2])
        refused = short_of_share(shape, passes, compiled)
        if refused:
            break
        chosen, below = (shape, dtype, rate, rows, compiled, eager_rate, took, eager_dtype), passes
        if passes < MIN_EPOCHS:  # a larger shape is slower still
            break
    shape, dtype, rate, rows, compiled, eager_rate, took, eager_dtype = chosen
    trains = train_seconds(shape, rate)  # the probes' seconds, the compilation's among them, and the validations'
    every = cadence(shape, rate)
    budget_epochs = rate * facts.sustained * trains / facts.train_tokens
    capped = not facts.epochs and budget_epochs > cap
    if facts.epochs:  # the passes asked for, or the clock's where it ends the run first; dropout follows them
        epochs = min(facts.epochs, budget_epochs) if facts.budget_seconds else facts.epochs
        dropout = dropout_for(epochs, facts.train_tokens)
    else:  # the budget's passes up to the cap; a capped run keeps the dropout of its whole budget
        epochs = min(budget_epochs, cap)
        dropout = dropout_for(budget_epochs, facts.train_tokens)
    if shape is LADDER[0]:
        dropout = min(dropout, SMALLEST_MAX_DROPOUT)
    decay = WEIGHT_DECAY if epochs >= near and (shape is not LADDER[0]
                                                or facts.train_tokens <= SMALLEST_DECAY_MAX_TOKENS) else 0.0
    # The run's length in epochs: the cap, or (a time budget) far enough past the expected passes that the clock
    # ends the run and the schedule follows the clock; with --epochs/--max-steps the flags set it.
    run_epochs = cap if capped else max(base.training.epochs, math.ceil(2 * budget_epochs))
    config = _config(base, shape, dtype, negatives, facts.threads).with_training(batch_size=rows, compile=compiled)
    extra = {"optimizer": "adamw", "weight_decay": decay} if decay else {}
    if facts.budget_seconds and facts.validation_tokens and not facts.validation_minutes:
        extra["validation_minutes"] = every
    one = one_validation(shape, rate)  # seconds of one validation (0 without a time budget or validation text)
    to_cap = cap * facts.train_tokens / (rate * facts.sustained)  # training seconds to the cap
    cap_validations = 1  # a capped run's validations by its steps, its last (after the loop) among them
    if capped and facts.budget_seconds and facts.validation_tokens:
        # The cap's steps end the run, so training's own cadence (a twentieth of the steps) would validate 20
        # times where rule 9 counted one every `every` minutes: 13 more on 45% of the Spanish Bible's quarter
        # hour, which then reached its clock 2 steps short of its cap (docs/auto.md). Validations are spread over
        # the cap's steps as half the budget the cap leaves unspent holds (at most 20): where one is cheap the
        # best model is not missed (the poems of `zh` peak before their 12 passes end), where it is dear the
        # clock's alone are made; --validation-every still wins.
        spare = budget - (clock() - began) - to_cap - periodic_validations(to_cap, one, every) * one
        cap_validations = capped_validations(spare, one)
        cap_steps = math.ceil(cap * steps_per_epoch(facts.train_tokens, rows, base.training.unroll_steps))
        extra["validation_every"] = max(1, math.ceil(cap_steps / cap_validations))
    config = dataclasses.replace(config, training=dataclasses.replace(config.training, dropout=dropout,
                                                                      epochs=run_epochs, **extra))
    if facts.budget_seconds:
        eager_named = "" if eager_dtype == dtype else f" {eager_dtype}"
        measured = f" (compiled; eager{eager_named} {eager_rate:,.0f})" if compiled else ""
        left_out, spent = "", clock() - began
        if budget - trains >= 1.0:
            periodic = periodic_validations(max(budget - spent, 1.0), one, every)
            vals = f" and {periodic} validation{'s' if periodic != 1 else ''} of {one:.0f} s" if periodic else ""
            left_out = f" ({_minutes(budget)} less the probe's {_minutes(spent)}{vals})"
        sustained = f" x {facts.sustained:g} sustained" if facts.sustained != 1 else ""
        why = (f"{rate:,.0f} tokens/s measured{measured}{sustained} x {_minutes(trains)}{left_out} = "
               f"{budget_epochs:.1f} passes over {facts.train_tokens / 1e6:.2f}M tokens")
        if "validation_minutes" in extra and every != VALIDATION_MINUTES:
            why += f", validated every {every:g} min"
        if capped:
            validations = max(periodic_validations(to_cap, one, every), cap_validations - 1)
            about = _minutes(to_cap + validations * one)
            spread = f", validated {cap_validations} times" if cap_validations > 1 else ""
            why += f"; it stops after {cap:g} (about {about}{spread}): more passes overfit so little text"
    else:
        why = (f"{epochs:g} epochs asked for; the shape an hour would get ({budget_epochs:.1f} passes at "
               f"{rate:,.0f} tokens/s)")
    if rows_ladder:
        why += "; " + stopped.get(shape.name, f"{rows:,} rows: the most the ladder or the corpus's sentences allow")
    reason = (f"auto: {shape.name}, {dtype}, {'compiled, ' if compiled else ''}"
              f"{f'{rows:,} rows, ' if rows_ladder or rows != base.training.batch_size else ''}dropout {dropout:g}"
              f"{f', AdamW decay {decay:g}' if decay else ''}, {config.training.n_negative_samples:,} "
              f"negatives{' (full softmax)' if negatives >= facts.vocab_size else ''}: {why}{refused}")
    reread = None
    if facts.budget_seconds and not facts.epochs and facts.device == "cpu":  # rule 11
        reread = {"after_seconds": READ_AFTER_SECONDS, "train_tokens": facts.train_tokens,
                  "sustained": facts.sustained, "probe_tokens_per_s": round(rate, 1),
                  "validation_seconds": round(one, 1), "validation_minutes": facts.validation_minutes or every,
                  "cadence_given": bool(facts.validation_minutes), "budget_seconds": facts.budget_seconds,
                  "cap": cap, "decay_from": near, "base_epochs": base.training.epochs,
                  "max_dropout": SMALLEST_MAX_DROPOUT if shape is LADDER[0] else 1.0,
                  "decays": shape is not LADDER[0] or facts.train_tokens <= SMALLEST_DECAY_MAX_TOKENS,
                  "expected_epochs": round(budget_epochs, 2), "dropout": dropout, "capped": capped,
                  "epochs": run_epochs}
    return Choice(config, reason, tuple(probes), epochs, shape.name, rate, sustained=facts.sustained,
                  reread=reread)


def auto_config(data_dir: Path, validation_dir: Path | None, user: dict | None, overrides: dict
                ) -> tuple[RunConfig, Choice]:
    """`train --preset auto`: the facts from the shards and the command line, the probe on this process, the
    choice, then the user's config file and flags over it (they win). Returns the run's configuration (its
    ``max_time`` less the probe's time, so the command keeps to its budget) and the `Choice`.

    # Parameters
    user : the ``--config`` dict or None; overrides : the flags given (`RunConfig.with_training` keywords).
    """
    import torch

    from elmo_cli.train import open_shards

    given = {k: v for k, v in overrides.items() if v is not None}
    given.update({k: v for k, v in (user or {}).get("training", {}).items() if k in ("max_time", "epochs",
                                                                                     "max_steps", "threads",
                                                                                     "device", "batch_size",
                                                                                     "unroll_steps",
                                                                                     "validation_minutes")
                  and k not in given})
    if launched_world_size() > 1:
        raise ElmoError("--preset auto probes one process; under torchrun give a fixed preset, or the choice of an "
                        "auto run on one process: --config RUN/config.json")
    dataset = open_shards(data_dir, "--data")
    vdataset = open_shards(validation_dir, "--validation") if validation_dir is not None else None
    B = given.get("batch_size") or _base().training.batch_size
    T = given.get("unroll_steps") or _base().training.unroll_steps
    tokens = dataset.total_tokens
    epochs = given.get("epochs") or (given["max_steps"] * B * T / max(tokens, 1) if given.get("max_steps") else None)
    threads = int(given.get("threads") or torch.get_num_threads())
    device = str(resolve_device(given.get("device")))
    may_compile = given.get("compile") is not False and device == "cpu" and machine.cxx_compiler() is not None
    facts = Facts(tokens, dataset.num_sentences, len(dataset.vocab), float(given.get("max_time") or 0.0), epochs,
                  threads, device, vdataset.total_tokens if vdataset is not None else 0,
                  given.get("batch_size"), given.get("unroll_steps"), may_compile,
                  given.get("validation_minutes") or None, SUSTAINED_SHARE if device == "cpu" else 1.0)
    start = time.monotonic()
    choice = choose(facts, lambda config, seconds: probe_rate(config, dataset, seconds), str(data_dir))
    spent = time.monotonic() - start
    _check_validation_fits(facts, choice.tokens_per_s, spent, str(validation_dir))
    chosen = choice.config
    asked = {**(user or {}).get("training", {}), **given}
    if "optimizer" in asked and "weight_decay" not in asked:  # the user's optimizer, without auto's decay
        chosen = dataclasses.replace(chosen, training=dataclasses.replace(chosen.training, weight_decay=0.0))
    config = merge_config(chosen, user, "--config").with_training(**overrides)
    if config.training.max_time:
        config = config.with_training(max_time=max(config.training.max_time - spent, 1.0))
    yours = _yours(choice.config, config)
    reread = choice.reread if not yours and config.training.max_time else None  # the user's choice stays as it is
    return config, dataclasses.replace(choice, probe_seconds=spent, reason=choice.reason + yours, reread=reread)


def probe_rate(config: RunConfig, dataset, seconds: float) -> float:
    """`train.measure_throughput` of `config`, or 0.0 when its step does not fit in the GPU's memory (where the
    rows ladder ends)."""
    import torch

    from elmo_cli.train import measure_throughput

    try:
        return measure_throughput(config, dataset, seconds)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return 0.0


def _yours(chosen: RunConfig, final: RunConfig) -> str:
    """What the user's flags or --config changed of what the line names, so the line says what trains."""
    changed = []
    if (final.model.lstm.dim, final.model.lstm.projection_dim) != (chosen.model.lstm.dim,
                                                                    chosen.model.lstm.projection_dim):
        changed.append(f"LSTM {final.model.lstm.dim}/{final.model.lstm.projection_dim}")
    if final.training.compile != chosen.training.compile:
        changed.append("compiled" if final.training.compile else "not compiled")
    for field, name, spec in (("dtype", "", ""), ("dropout", "dropout ", "g"), ("optimizer", "", ""),
                              ("weight_decay", "weight decay ", "g"), ("n_negative_samples", "negatives ", ",")):
        value = getattr(final.training, field)
        if value != getattr(chosen.training, field):
            changed.append(name + format(value, spec))
    return f"; yours over it: {', '.join(changed)}" if changed else ""


def _check_validation_fits(facts: Facts, rate: float, spent: float, source: str) -> None:
    """A time budget must leave room for the run to validate: refuse one that a single validation would eat."""
    if not facts.budget_seconds or not facts.validation_tokens:
        return
    one = facts.validation_tokens / rate  # a validation scores both directions at about the training speed
    if facts.budget_seconds - spent < 4 * one:
        need = math.ceil(spent + 4 * one)  # whole seconds, up: never 'at least' what was just refused
        raise ElmoError(f"--max-time {_minutes(facts.budget_seconds)} is too short for --preset auto with "
                        f"{source}: one validation of its {facts.validation_tokens:,} tokens takes about "
                        f"{one:.0f} s here and the probe took {spent:.0f} s; give at least {_minutes(need)}")


def _config(base: RunConfig, shape: Shape, dtype: str, negatives: int, threads: int) -> RunConfig:
    training = dataclasses.replace(base.training, dtype=dtype, n_negative_samples=negatives, threads=threads)
    return RunConfig(model=shape.model, training=training)


def _minutes(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{round(seconds / 60, 1):g} min" if seconds < 7200 else f"{round(seconds / 3600, 2):g} h"
