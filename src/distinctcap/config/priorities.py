"""Scheduling priorities of the training and entropy jobs (ARCHITECTURE.md, Stages): estimated
work, so the head of the longest chain of training starts first. Read by common.smk while
Snakemake parses; imports no torch.
"""

from __future__ import annotations

from distinctcap.config.rungraph import run_dependencies
from distinctcap.core.settings import TrainConfig
from distinctcap.methods.facts import FACTS


def run_priorities(run_configs: dict[str, dict]) -> dict[str, int]:
    """Scheduling priority of each run's training job (effective configs by name): its
    estimated work (steps x its method's step cost against an MLE step, `step_cost`) plus the
    largest priority among the runs that wait for it, so the head of the longest chain of
    training starts first: on 2 cores the negative teacher, which UNKT waits for, before the
    positive one, which nothing waits for, and CL (300 steps, ~6 MLE steps each) before the
    positive teacher (1,500 MLE steps; issue 46: by steps alone CL went after it and ended
    the default's training 2.5 minutes later)."""
    waiting = {n: [m for m, r in run_configs.items() if n in run_dependencies(r)]
               for n in run_configs}  # fmt: skip
    done: dict[str, int] = {}

    def chain(name: str) -> int:
        if name not in done:
            run = run_configs[name]
            work = TrainConfig.from_dict(run["train"]).steps * step_cost(run)
            done[name] = round(work) + max((chain(m) for m in waiting[name]), default=0)
        return done[name]

    return {name: chain(name) for name in run_configs}


def step_cost(run: dict) -> float:
    """Run block `run`'s optimiser step against an MLE step (its method's facts; a run
    without a known method counts as MLE)."""
    facts = FACTS.get(run.get("method", "mle"))
    return facts.step_cost(run) if facts else 1.0


def entropy_priority(run_configs: dict[str, dict], priorities: dict[str, int]) -> int:
    """Scheduling priority of the entropy rules: above every run trained on D- or D+, whose
    chain they head (without it, on 2 cores, the fine-tunes of the reference ran before the
    entropy split and the teachers and UNKT started 8 minutes late); 0 when no run needs them."""
    split_runs = [n for n, r in run_configs.items() if r.get("data") in ("D-", "D+")]
    return max((priorities[n] + 1 for n in split_runs), default=0)
