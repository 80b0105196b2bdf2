"""The training recipe around the loop: learning-rate schedule, optimizers, keep-best model files, patience, the
Kneser-Ney reference during training, curves.png and `elmo-cli plot`."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from elmo_cli.cli import app
from elmo_cli.tasks.cli import task_app
from elmo_cli.train import lr_factor, train
from elmo_cli.train_config import TrainingConfig
from train_fixtures import make_shards, tiny_config
from vocab.errors import ElmoError

runner = CliRunner()


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> tuple[Path, Path, Path]:
    return make_shards(tmp_path_factory.mktemp("corpus"))


def test_lr_factor_hand_computed():
    const = TrainingConfig()
    assert lr_factor(0.0, const) == lr_factor(0.7, const) == 1.0
    lin = TrainingConfig(lr_schedule="linear", final_lr_ratio=0.1)
    assert lr_factor(0.0, lin) == 1.0 and lr_factor(1.0, lin) == pytest.approx(0.1)
    assert lr_factor(0.5, lin) == pytest.approx(0.55)  # halfway from 1 down to 0.1
    cos = TrainingConfig(lr_schedule="cosine", warmup=0.1)
    assert lr_factor(0.05, cos) == pytest.approx(0.5)  # halfway up the warmup
    assert lr_factor(0.1, cos) == pytest.approx(1.0)
    assert lr_factor(0.55, cos) == pytest.approx(0.5)  # halfway down the cosine
    assert lr_factor(1.0, cos) == pytest.approx(0.0) and lr_factor(2.0, cos) == pytest.approx(0.0)


@pytest.mark.parametrize("training, message", [({"optimizer": "sgd"}, "training.optimizer must be one of"),
                                               ({"lr_schedule": "step"}, "training.lr_schedule must be one of"),
                                               ({"weight_decay": 0.1}, "not adagrad"),
                                               ({"warmup": 1.0}, "warmup must be below 1")])
def test_bad_recipe_is_refused(training, message):
    with pytest.raises(ElmoError, match=message):
        tiny_config(**training)


def test_unknown_optimizer_on_the_command_line(shards, tmp_path):
    _, train_dir, _ = shards
    r = runner.invoke(app, ["train", "--data", str(train_dir), "--output", str(tmp_path / "r"), "--optimizer",
                            "lion"])
    assert r.exit_code == 1 and r.stderr.startswith("error:") and "adagrad, adam, adamw" in r.stderr


def test_adam_cosine_learns_and_validates_beside_kneser_ney(shards, tmp_path):
    _, train_dir, valid_dir = shards
    run = tmp_path / "run"
    r = train(tiny_config(max_steps=60, optimizer="adam", lr=0.01, lr_schedule="cosine", warmup=0.1,
                          n_negative_samples=1000, validation_every=20), train_dir, run, validation_dir=valid_dir)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    baseline = [x for x in records if x["kind"] == "baseline"]
    validations = [x for x in records if x["kind"] == "validation"]
    lrs = [x["lr"] for x in records if x["kind"] == "train"]
    assert len(baseline) == 1 and baseline[0]["name"] == "kn5" and r.baseline["name"] == "kn5"
    assert [v["step"] for v in validations] == [20, 40, 60]
    assert all(v["baseline_average_perplexity"] == round(baseline[0]["average_perplexity"], 4) for v in validations)
    assert lrs[0] < lrs[2] and lrs[-1] < 1e-3 * 0.01 + 1e-6  # warmed up, then annealed to 0 at the end
    assert validations[-1]["average_perplexity"] < validations[0]["average_perplexity"]
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((run / "baseline.json").read_text())["result"]["name"] == "kn5"


def test_model_files_follow_the_best_validation_and_patience_stops(shards, tmp_path):
    _, train_dir, valid_dir = shards
    run = tmp_path / "run"
    # lr 5 makes every update after the first validation worse, so the best stays at step 5.
    r = train(tiny_config(max_steps=200, optimizer="adagrad", lr=5.0, validation_every=5, patience=2,
                          clip_norm=0), train_dir, run, validation_dir=valid_dir)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    validations = [x for x in records if x["kind"] == "validation"]
    best = min(validations, key=lambda v: v["average_perplexity"])
    assert r.stopped == "patience" and r.step < 200
    assert r.best["step"] == best["step"] and sum(v["best"] for v in validations) >= 1
    assert len(validations) - 1 - validations.index(best) == 2  # two validations without improvement
    from elmo_cli.loading import load_model
    from elmo_cli.train import validation_perplexity
    from vocab.shards import ShardDataset

    loaded = load_model(run)
    again = validation_perplexity(loaded.model, ShardDataset(valid_dir), 64, loaded.device)
    assert again["average_perplexity"] == pytest.approx(best["average_perplexity"], rel=1e-4)


def test_plot_draws_several_runs_and_refuses_a_non_run(shards, tmp_path):
    _, train_dir, valid_dir = shards
    for name in ("a", "b"):
        train(tiny_config(max_steps=10, validation_every=5, seed=ord(name)), train_dir, tmp_path / name,
              validation_dir=valid_dir)
    out = tmp_path / "both.png"
    r = runner.invoke(app, ["plot", str(tmp_path / "a"), str(tmp_path / "b"), "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    r = runner.invoke(app, ["plot", str(tmp_path)])
    assert r.exit_code == 1 and "no metrics.jsonl" in r.stderr


def test_a_perplexity_axis_within_a_decade_is_labelled_across_its_range():
    # a run falling from 142 to 77: a log axis alone would label 80, 90 and 100, and nothing above 100
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from elmo_cli.plot import label_perplexity_axis

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [142.4, 108.6, 77.0])
    ax.set_yscale("log")
    label_perplexity_axis(ax)
    fig.canvas.draw()
    low, high = ax.get_ylim()
    labelled = [float(t.get_text()) for t in ax.get_yticklabels()
                if t.get_text() and low <= t.get_position()[1] <= high]
    plt.close(fig)
    assert len(labelled) >= 5 and min(labelled) <= 80 and max(labelled) >= 130, labelled


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.startswith("elmo-cli ")


def test_every_help_ends_with_its_example():
    names = [c.name for c in app.registered_commands] + [f"task {c.name}" for c in task_app.registered_commands]
    assert len(names) >= 11
    for name in names:
        r = runner.invoke(app, [*name.split(), "--help"], env={"COLUMNS": "250"})
        assert r.exit_code == 0, name
        last = [line.strip() for line in r.stdout.splitlines() if line.strip()][-1]
        assert last.startswith(f"Example: elmo-cli {name} "), (name, last)


def test_time_budget_progress_counts_the_steps_it_allows(shards, tmp_path):
    _, train_dir, _ = shards
    infos = []
    r = train(tiny_config(epochs=10_000, max_time=3.0), train_dir, tmp_path / "run", on_step=infos.append)
    assert r.stopped == "max_time" and r.total_steps > 100 * r.step  # the epochs would take far longer
    last = infos[-1]
    # The progress a user sees ends near the step where the budget ran out, not at the epochs' step count.
    assert last.eta < 1.0 and last.step <= last.total_steps <= last.step + max(5, last.step // 5)


def test_tokens_per_second_leaves_validation_time_out():
    from elmo_cli.train import _Meter

    meter = _Meter()
    meter.add(1.0, 1.0, 1000)
    time.sleep(0.4)
    meter.exclude(0.3)  # as if 0.3 s of those 0.4 s were a validation
    rate = meter.record(1, 10, 1000, 0.0, 0.1, 0.4)["tokens_per_s"]
    assert rate > 1000 / 0.2  # 1000 tokens in about 0.1 s of training, not 0.4 s
