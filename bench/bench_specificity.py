"""Cost of a specificity training step as a ratio to an MLE step of the same model and batch.

    PYTHONPATH=src python bench/bench_specificity.py [--device cuda] [--clip ViT-B-32] [--reps 5]

A specificity step (methods/specificity.py) is: greedy (or Gumbel) decoding without gradient,
a teacher-forced pass of the captioner on its own tokens, the frozen CLIP text tower forward
and backward (straight-through), the loss. The parts are timed too. Methods are timed
interleaved so load drift on a shared machine hits all alike, best repetition reported; on CPU
the clock is process CPU time with one torch thread, on GPU wall time between
synchronisations. Random weights everywhere (CLIP too: `--clip` names an open_clip
architecture built without weights), B captions of B distinct images.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import open_clip
import torch

import distinctcap.clip.weights  # noqa: F401  (registers shapes-vit-tiny)
from distinctcap.captioner.model import Captioner, CaptionerConfig
from distinctcap.core.run import RunConfig
from distinctcap.data.tokenizer import CaptionTokenizer
from distinctcap.features.batches import CaptionData
from distinctcap.features.neighbours import NeighbourTable, top_neighbours
from distinctcap.features.read import ImageFeatures
from distinctcap.methods import METHODS
from distinctcap.methods.base import TrainContext
from distinctcap.methods.specificity import generate_ids, output_probs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--clip", default="shapes-vit-tiny", help="open_clip architecture")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--max-len", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    clock = time.perf_counter if dev.type == "cuda" else time.process_time

    torch.manual_seed(0)
    clip = open_clip.create_model(args.clip).to(dev)
    dp = clip.text_projection.shape[1]
    g = torch.Generator().manual_seed(0)
    clip_ids = [0, 49406, 49407, 1000] + sorted(
        torch.randperm(40000, generator=g)[: args.vocab - 4].add(1001).tolist()
    )
    tok = CaptionTokenizer(clip_ids)
    n = 4 * args.batch
    feats = ImageFeatures(
        np.arange(n),
        torch.nn.functional.normalize(torch.randn(n, dp, generator=g), dim=-1),
        torch.randn(n, 64, 128, generator=g).half(),
    )
    tokens = [
        torch.randint(4, args.vocab, (int(k),), generator=g).tolist()
        for k in torch.randint(8, 17, (n,), generator=g)
    ]
    data = CaptionData(feats, np.arange(n), np.arange(n), tokens, args.max_len)
    model = (
        Captioner(
            CaptionerConfig(
                args.vocab,
                128,
                dp,
                width=args.width,
                enc_layers=args.layers,
                dec_layers=args.layers,
                heads=4,
                ffn=4 * args.width,
                max_len=args.max_len,
            )
        )
        .to(dev)
        .train()
    )
    ctx = TrainContext(dev, data, {}, tok)
    table = NeighbourTable(
        feats.image_ids, top_neighbours(feats.pooled, 2).numpy(), feats.image_ids
    )
    batch = data.batch(torch.arange(args.batch)).to(dev)

    def objective(method: str, **options):
        extra = {"clip": clip, "neighbours": table} if method == "specificity" else {}
        return METHODS[method](RunConfig(name=method, options=options), ctx, **extra)

    variants = {
        "mle": objective("mle"),
        "specificity cos": objective("specificity", loss="cos"),
        "specificity ccos": objective("specificity", loss="ccos"),
        "specificity ccos gumbel": objective("specificity", loss="ccos", sampling="gumbel"),
        "specificity ccos mle 0.1": objective("specificity", loss="ccos", mle_weight=0.1),
    }
    encoder = variants["specificity ccos"].encoder

    def step(obj, rep):
        loss, _ = obj.loss(model, batch, rep, 1000)
        loss.backward()
        model.zero_grad(set_to_none=True)

    def part_generate(rep):
        generate_ids(model, batch.grid, batch.pooled)

    seqs, _ = generate_ids(model, batch.grid, batch.pooled)

    def part_teacher_forced(rep):
        output_probs(model, batch.grid, batch.pooled, seqs).sum().backward()
        model.zero_grad(set_to_none=True)

    def part_clip(rep):
        probs = torch.rand(*seqs.shape, args.vocab, device=dev).requires_grad_()
        encoder(seqs, probs).sum().backward()

    fns = {name: (lambda rep, o=obj: step(o, rep)) for name, obj in variants.items()}
    fns |= {
        "  part: generate (no grad)": part_generate,
        "  part: teacher-forced fwd+bwd": part_teacher_forced,
        "  part: CLIP text fwd+bwd": part_clip,
    }
    times: dict[str, list[float]] = {name: [] for name in fns}
    for rep in range(args.reps + 1):  # rep 0 warms up
        for name, fn in fns.items():
            sync()
            start = clock()
            fn(rep)
            sync()
            if rep:
                times[name].append(clock() - start)
    best = {name: min(t) for name, t in times.items()}
    print(
        f"device {dev}, threads {torch.get_num_threads()}, batch {args.batch}, captioner "
        f"{model.num_params() / 1e6:.2f} M params (width {args.width}, {args.layers}+"
        f"{args.layers} layers, vocab {args.vocab}), CLIP {args.clip} (context "
        f"{encoder.context_length}), generated length {seqs.shape[1]}, best of {args.reps}, "
        f"{'CPU' if dev.type == 'cpu' else 'wall'} time"
    )
    for name, t in best.items():
        print(f"{name:>32}: {t * 1e3:8.1f} ms  ratio to MLE step {t / best['mle']:6.2f}")


if __name__ == "__main__":
    main()
