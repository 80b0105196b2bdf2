"""Dump throughput of `dump_embeddings` against a straightforward implementation, measured in the same run.

200 ordinary English sentences of about 25 tokens (from examples/austen_heldout.txt), float32, batch 64, random
weights in the published `small` and `original` shapes. The baseline is what one writes first: batches in input
order, the character CNN as one ``nn.Conv1d`` per filter bank on every running token, and an LSTM cell that runs one
time step at a time with ``[x_t ; h_{t-1}] @ W_0`` (no input product hoisted out of the loop). Both write the same
HDF5 layout; their outputs are checked equal (allclose) before any figure is printed.

Then the memory of a dump: peak RSS of `elmo-cli dump-embeddings` (a fresh process each, the `tiny` shape) on the
first 3,200 lines of the Austen corpus and on the first 32,000 (ten times the input, with new words).

    python -m benchmarks.run embed        (or: python -m benchmarks.bench_embed [small original] [memory])
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.corpora import austen_novels
from benchmarks.results import Recording, run_measured
from elmo_cli.bilm_format import save_model_dir
from elmo_cli.dump import dump_embeddings
from elmo_cli.presets import PRESETS
from elmo_cli.loading import LoadedModel
from elmo_cli.model.bilm import BiLM, reverse_padded, to_model_chars
from vocab.chars import ByteChars
from vocab.tokenize import TextEncoder

ROOT = Path(__file__).resolve().parent.parent
N_SENTENCES, TARGET_LEN, BATCH = 200, 25, 64


def load_sentences() -> list[list[str]]:
    """The N_SENTENCES lines closest to TARGET_LEN tokens, in file order."""
    lines = [l.split() for l in (ROOT / "examples" / "austen_heldout.txt").read_text("utf-8").splitlines()]
    lines = [l for l in lines if len(l) >= 5]
    keep = set(sorted(range(len(lines)), key=lambda i: (abs(len(lines[i]) - TARGET_LEN), i))[:N_SENTENCES])
    return [lines[i] for i in sorted(keep)]


# ---- the straightforward implementation ---------------------------------------------------------------------------
class NaiveEncoder(nn.Module):
    """Char CNN with one Conv1d per filter bank, run on every token of the batch."""

    def __init__(self, model: BiLM):
        super().__init__()
        enc = model.encoder
        self.enc = enc
        self.convs = nn.ModuleList()
        for kern, bias in zip(enc.kernels, enc.biases):  # kern (w, E, n) -> Conv1d weight (n, E, w)
            conv = nn.Conv1d(kern.shape[1], kern.shape[2], kern.shape[0])
            conv.weight.data.copy_(kern.detach().permute(2, 1, 0))
            conv.bias.data.copy_(bias.detach())
            self.convs.append(conv)

    def forward(self, chars: torch.Tensor) -> torch.Tensor:  # (N, W) -> (N, P)
        x = self.enc.char_embedding(chars).transpose(1, 2)  # (N, E, W)
        h = torch.cat([conv(x).amax(dim=2) for conv in self.convs], dim=1)  # (N, F)
        h = F.relu(h) if self.enc.config.activation == "relu" else torch.tanh(h)
        for hw in self.enc.highways:
            h = hw(h)
        return self.enc.projection(h)


def naive_lstm(layer, x: torch.Tensor) -> torch.Tensor:
    """One step at a time: z = [x_t ; h] @ W_0 + B, no hoisted input product. x (B, T, P) -> (B, T, P)."""
    B, T, _ = x.shape
    H = layer.dim
    w0 = torch.cat([layer.input_weight, layer.recurrent_weight], dim=1).t()  # (2P, 4H)
    bias = layer.bias + layer.forget_bias
    h, c = layer.zero_state(B)
    outs = []
    for t in range(T):
        z = torch.cat([x[:, t], h], dim=1) @ w0 + bias
        i, j, f, o = z.split(H, dim=1)
        c = (torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)).clamp(-layer.cell_clip, layer.cell_clip)
        h = ((torch.sigmoid(o) * torch.tanh(c)) @ layer.projection_weight.t()).clamp(-layer.proj_clip,
                                                                                    layer.proj_clip)
        outs.append(h)
    return torch.stack(outs, dim=1)


@torch.no_grad()
def naive_dump(model: BiLM, sentences: list[list[str]], output: Path) -> None:
    chars_enc, encoder = ByteChars(), NaiveEncoder(model)
    with h5py.File(output, "w") as f:
        for start in range(0, len(sentences), BATCH):
            batch = sentences[start : start + BATCH]
            rows = [chars_enc.encode_tokens(["<S>", *s, "</S>"]) for s in batch]
            lengths = torch.tensor([r.shape[0] for r in rows])
            T = int(lengths.max())
            flat = to_model_chars(np.concatenate(rows))  # every running token, (N, W)
            emb = encoder(flat)  # (N, P)
            x = torch.zeros(len(batch), T, emb.shape[1])
            offset = 0
            for b, r in enumerate(rows):
                x[b, : r.shape[0]] = emb[offset : offset + r.shape[0]]
                offset += r.shape[0]
            outs = [torch.cat([x, x], dim=-1)]
            fx, bx = x, reverse_padded(x, lengths)
            for l, (fl, bl) in enumerate(zip(model.forward_lstm.layers, model.backward_lstm.layers)):
                fo, bo = naive_lstm(fl, fx), naive_lstm(bl, bx)
                if l > 0:
                    fo, bo = fo + fx, bo + bx
                outs.append(torch.cat([fo, reverse_padded(bo, lengths)], dim=-1))
                fx, bx = fo, bo
            layers = torch.stack(outs).numpy()  # (L+1, B, T, 2P)
            for b, s in enumerate(batch):
                f.create_dataset(str(start + b), data=layers[:, b, 1 : len(s) + 1])


# ---- measurement ----------------------------------------------------------------------------------------------------
def max_diff(a: Path, b: Path) -> float:
    """The largest |difference| between two dumps' line datasets."""
    with h5py.File(a) as fa, h5py.File(b) as fb:
        return max(float(np.abs(fa[k][...] - fb[k][...]).max()) for k in fb if k.isdigit())


def run_config(name: str, sentences: list[list[str]], tmp: Path, text_file: Path) -> dict:
    torch.manual_seed(0)
    model = BiLM(PRESETS[name].config.model).eval()
    loaded = LoadedModel(model, TextEncoder(chars=ByteChars()), None, torch.device("cpu"))
    n_tokens = sum(len(s) for s in sentences)
    warm = tmp / "warm.txt"
    warm.write_text("\n".join(" ".join(s) for s in sentences[:8]) + "\n", encoding="utf-8")
    dump_embeddings(loaded, warm, tmp / "warm.hdf5", batch_size=BATCH, force=True)
    naive_dump(model, sentences[:8], tmp / "warm_naive.hdf5")
    times = {}
    t = time.perf_counter()
    naive_dump(model, sentences, tmp / f"naive_{name}.hdf5")
    times["baseline"] = time.perf_counter() - t
    t = time.perf_counter()
    dump_embeddings(loaded, text_file, tmp / f"fast_{name}.hdf5", batch_size=BATCH, force=True)
    times["elmo-cli"] = time.perf_counter() - t
    diff = max_diff(tmp / f"fast_{name}.hdf5", tmp / f"naive_{name}.hdf5")
    assert diff < 1e-4, f"{name}: outputs differ by {diff}"
    # Size per token: float16 on a 40-sentence sample (the size does not depend on the weights' values).
    sample = tmp / "sample.txt"
    sample.write_text("\n".join(" ".join(s) for s in sentences[:40]) + "\n", encoding="utf-8")
    n_sample = sum(len(s) for s in sentences[:40])
    sizes = {"float32": (tmp / f"fast_{name}.hdf5").stat().st_size / n_tokens}
    for dtype, compression in (("float16", "none"), ("float16", "gzip")):
        out = tmp / f"{dtype}_{compression}.hdf5"
        dump_embeddings(loaded, sample, out, batch_size=BATCH, dtype=dtype, compression=compression,
                        force=True)
        sizes[f"{dtype}{'+' + compression if compression != 'none' else ''}"] = out.stat().st_size / n_sample
    return {"name": name, "tokens": n_tokens, "diff": diff, "times": times, "bytes_per_token": sizes}


def recurrent_step_rate(batch: int = BATCH, proj: int = 512, dim: int = 4096, repeats: int = 20) -> float:
    """GFLOP/s of one LSTM step's recurrent product at the `original` shape, ``(B, P) @ (P, 4H)`` accumulated in
    place as the real path does: the floor under any fp32 implementation's time per step."""
    h, w, z = torch.randn(batch, proj), torch.randn(proj, 4 * dim), torch.randn(batch, 4 * dim)
    z.addmm_(h, w)
    t = time.perf_counter()
    for _ in range(repeats):
        z.addmm_(h, w)
    return 2 * batch * proj * 4 * dim * repeats / (time.perf_counter() - t) / 1e9




def peak_rss_mb(args: list[str]) -> tuple[float, float]:
    """Run `elmo-cli ARGS` in a fresh process; its wall seconds and its own peak RSS in MB (VmHWM)."""
    _, wall, peak = run_measured(["-c", "from elmo_cli.cli import app; app()", *args])
    return wall, peak


def dump_memory(tmp: Path, lines: int = 3_200, scale: int = 10) -> dict:
    """Peak RSS of a dump of `lines` corpus lines and of `scale` times as many (fp16, layers average)."""
    corpus = austen_novels()
    text = [l for l in corpus.read_text("utf-8").splitlines() if l.strip()]
    scale = min(scale, len(text) // lines)
    torch.manual_seed(0)
    save_model_dir(BiLM(PRESETS["tiny"].config.model).eval(), tmp / "model")
    result = {"corpus": corpus.name, "scale": scale}
    for k, n in (("1x", lines), (f"{scale}x", lines * scale)):
        src = tmp / f"mem_{k}.txt"
        src.write_text("\n".join(text[:n]) + "\n", encoding="utf-8")
        wall, rss = peak_rss_mb(["dump-embeddings", str(src), str(tmp / f"mem_{k}.hdf5"), "--options",
                                 str(tmp / "model" / "options.json"), "--weights", str(tmp / "model" / "weights.hdf5"),
                                 "--layers", "average", "--dtype", "float16"])
        result[k] = {"lines": n, "tokens": sum(len(l.split()) for l in text[:n]), "seconds": wall, "peak_rss_mb": rss,
                     "file_mb": (tmp / f"mem_{k}.hdf5").stat().st_size / 1e6}
        (tmp / f"mem_{k}.hdf5").unlink()
    return result


def main(configs: list[str] | None = None) -> None:
    configs = configs or ["small", "original", "memory"]
    memory = "memory" in configs
    configs = [c for c in configs if c != "memory"]
    sentences = load_sentences()
    n_tokens = sum(len(s) for s in sentences)
    print(f"{len(sentences)} sentences, {n_tokens} tokens (mean {n_tokens / len(sentences):.1f}), batch {BATCH}, "
          f"float32, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other work on the host slows both)")
    command = "python -m benchmarks.bench_embed" + ("" if configs == ["small", "original"] and memory else
                                                    " " + " ".join(configs + (["memory"] if memory else [])))
    with tempfile.TemporaryDirectory() as d, Recording("embed", command) as rec:
        tmp = Path(d)
        text_file = tmp / "input.txt"
        text_file.write_text("\n".join(" ".join(s) for s in sentences) + "\n", encoding="utf-8")
        for name in configs:
            r = run_config(name, sentences, tmp, text_file)
            base, fast = r["times"]["baseline"], r["times"]["elmo-cli"]
            print(f"{name:>9}: baseline {r['tokens'] / base:8,.0f} tokens/s | elmo-cli dump-embeddings "
                  f"{r['tokens'] / fast:8,.0f} tokens/s | speed-up {base / fast:4.1f}x | max |diff| {r['diff']:.1e}",
                  flush=True)
            b = r["bytes_per_token"]
            rec.figures[name] = {"baseline_tokens_per_s": round(r["tokens"] / base),
                                 "elmo_cli_tokens_per_s": round(r["tokens"] / fast), "speed_up": round(base / fast, 1),
                                 "max_abs_diff": r["diff"], "bytes_per_token": {k: round(v) for k, v in b.items()}}
            print(f"{'':>9}  file size per token (layers=all): " + ", ".join(f"{k} {v:,.0f} B" for k, v in b.items()),
                  flush=True)
        if memory:
            m = dump_memory(tmp)
            one, big = m["1x"], m[f"{m['scale']}x"]
            rec.figures["memory"] = {"scale": m["scale"], "tokens_1x": one["tokens"], "tokens_big": big["tokens"],
                                     "peak_rss_mb_1x": round(one["peak_rss_mb"]),
                                     "peak_rss_mb_big": round(big["peak_rss_mb"]),
                                     "ratio": round(big["peak_rss_mb"] / one["peak_rss_mb"], 2)}
            print(f"   memory: dump-embeddings peak RSS {one['peak_rss_mb']:,.0f} MB on {one['tokens']:,} tokens vs "
                  f"{big['peak_rss_mb']:,.0f} MB on {big['tokens']:,} ({m['scale']}x the input, {big['file_mb']:,.0f} MB "
                  f"written): {big['peak_rss_mb'] / one['peak_rss_mb']:.2f}x (tiny shape, {m['corpus']})", flush=True)
        if configs:
            rate = rec.figures["recurrent_step_gflops"] = round(recurrent_step_rate())
            print(f"recurrent step product (64 x 512) @ (512 x 16384), in place: {rate:.0f} GFLOP/s "
                  f"(the per-step floor of every fp32 implementation, baseline included)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or None)
