"""Cost of an SCST step (K samples per image, CIDEr-D reward) as a ratio to an MLE step, and
the reward's share of the SCST step (issue 49: at most 3x, reward at most 20 %).

    PYTHONPATH=src python bench/bench_scst.py [--device cuda] [--reps 7] [--k 5]

A "step" is the objective's forward plus backward on one micro-batch (the optimiser update is
the same for every method and left out): MLE on B captions of B / 5 images (5 captions an
image, as a training batch holds them), SCST on the same batch, i.e. K samples of each of its
B / 5 images (sampling without gradient, the reward, a teacher-forced pass with gradient). The
reward's time is that of the objective's `rewards` calls inside the SCST step; its training
captions (400 images x 5, random tokens, as bench_cl_smile.py) give the document frequencies,
built before the timing. Timing as bench_cl_smile.py: interleaved, the fastest repetition,
process CPU time with one torch thread on the CPU. A random model rarely emits eos, so its
samples run to max_len: the worst case for the sampling loop and the reward.
"""

from __future__ import annotations

import argparse

import torch
from bench_cl_smile import add_model_args, model_and_data, setup

from distinctcap.core.run import RunConfig
from distinctcap.methods import METHODS
from distinctcap.methods.base import TrainContext

BUDGET_STEP, BUDGET_REWARD = 3.0, 0.20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=50, help="captions per micro-batch (5 an image)")
    ap.add_argument("--k", type=int, default=5, help="SCST samples per image")
    add_model_args(ap)
    args = ap.parse_args()
    dev, sync, clock = setup(args)
    model, data = model_and_data(args, dev)
    ctx = TrainContext(dev, data)
    batch = data.batch(torch.arange(args.batch)).to(dev)
    mle = METHODS["mle"](RunConfig(name="mle"), ctx)
    scst = METHODS["scst"](RunConfig(name="scst", options={"k": args.k}), ctx)
    scst.cider(model)  # the document frequencies: once per run, not per step

    reward_time = [0.0]
    rewards = scst.rewards

    def timed_rewards(*a, **kw):
        sync()
        start = clock()
        out = rewards(*a, **kw)
        reward_time[0] += clock() - start
        return out

    scst.rewards = timed_rewards

    def step(obj, rep: int) -> None:
        loss, _ = obj.loss(model, batch, rep, 1000)
        loss.backward()
        model.zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {"mle": [], "scst": [], "reward": []}
    for rep in range(args.reps + 1):  # rep 0 warms up
        for name, obj in (("mle", mle), ("scst", scst)):
            reward_time[0] = 0.0
            sync()
            start = clock()
            step(obj, rep)
            sync()
            if rep:
                times[name].append(clock() - start)
                if name == "scst":
                    times["reward"].append(reward_time[0])

    best = {name: min(t) for name, t in times.items()}
    fastest = times["scst"].index(best["scst"])
    share = times["reward"][fastest] / best["scst"]
    ratio = best["scst"] / best["mle"]
    print(
        f"device {dev}, threads {torch.get_num_threads()}, batch {args.batch} captions of "
        f"{args.batch // 5} images, K = {args.k}, {model.num_params() / 1e6:.2f} M params "
        f"(width {args.width}, {args.layers}+{args.layers} layers, vocab {args.vocab}, grid "
        f"{args.grid}, max_len {model.cfg.max_len}), best of {args.reps}, "
        f"{'CPU' if dev.type == 'cpu' else 'wall'} time"
    )
    print(f"  mle step: {best['mle'] * 1e3:8.1f} ms")
    verdict = "ok" if ratio <= BUDGET_STEP else "OVER"
    print(f" scst step: {best['scst'] * 1e3:8.1f} ms  ratio {ratio:.2f} "
          f"(budget {BUDGET_STEP:.0f}x: {verdict})")  # fmt: skip
    verdict = "ok" if share <= BUDGET_REWARD else "OVER"
    print(f"    reward: {times['reward'][fastest] * 1e3:8.1f} ms  share of the scst step "
          f"{share:.1%} (budget {BUDGET_REWARD:.0%}: {verdict})")  # fmt: skip


if __name__ == "__main__":
    main()
