"""The typed settings of config sections: `TrainConfig` (the `train` section), `EvalSettings`
(the metric keys of `evaluate`) and `JudgeSettings` (`evaluate.judge`, the one shape in which
the rules, common.smk and judge.smk, and the code read the judge CLIP).

Each field's default is the repository schema's (workflow/schemas/, distinctcap.core.schema),
the one owner of every default and allowed value. Imports no torch: the workflow reads them
while Snakemake parses.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass, field, fields

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.schema import repo_schema, schema_default
from distinctcap.core.validation import check_section, unknown_key


def steps_per_epoch(n_captions: int, batch_size: int, grad_accum: int = 1) -> float:
    """Optimiser steps per pass over `n_captions` training captions, as the trainer counts them
    (features/batches.py BatchOrder drops the last incomplete micro-batch; grad_accum
    micro-batches a step). Epoch-stated schedules (train.epochs, warmup_epochs, unkt
    warmup_epochs) use it."""
    batch_size = max(1, min(int(batch_size), n_captions))
    return (n_captions // batch_size) / int(grad_accum)


def from_schema(*keys: str):
    """A dataclass field whose default is the repository schema's default of the key at `keys`
    (a fresh copy per instance for a list or a dict)."""
    value = schema_default(*keys)
    if isinstance(value, list | dict):
        return field(default_factory=functools.partial(copy.deepcopy, value))
    return field(default=value)


# ---------------------------------------------------------------------------------------------
# The `train` section


@dataclass
class TrainConfig:
    """The `train` config section: its keys' meaning, defaults and allowed values are the
    schema's (workflow/schemas/sections/train.yaml), which every instance is checked against."""

    steps: int = from_schema("train", "steps")
    epochs: float | None = from_schema("train", "epochs")
    batch_size: int = from_schema("train", "batch_size")
    grad_accum: int = from_schema("train", "grad_accum")
    group_by_image: bool = from_schema("train", "group_by_image")
    lr: float = from_schema("train", "lr")
    warmup_steps: int = from_schema("train", "warmup_steps")
    warmup_epochs: float | None = from_schema("train", "warmup_epochs")
    schedule: str = from_schema("train", "schedule")
    final_lr_ratio: float = from_schema("train", "final_lr_ratio")
    weight_decay: float = from_schema("train", "weight_decay")
    betas: tuple[float, float] = from_schema("train", "betas")
    grad_clip: float = from_schema("train", "grad_clip")
    precision: str = from_schema("train", "precision")
    val_every: int = from_schema("train", "val_every")
    val_captions: int = from_schema("train", "val_captions")
    val_batch_size: int = from_schema("train", "val_batch_size")
    select_metric: str = from_schema("train", "select_metric")
    patience: int = from_schema("train", "patience")
    checkpoint_every: int = from_schema("train", "checkpoint_every")
    checkpoint_minutes: float | None = from_schema("train", "checkpoint_minutes")
    log_every: int = from_schema("train", "log_every")
    compile: bool | str = from_schema("train", "compile")  # true | false | "auto"

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        # select_metric is checked against the run's method (config.rungraph.
        # effective_run_config), whose objective may compute metrics of its own
        values = {**vars(self), "betas": list(self.betas)}
        del values["select_metric"]
        check_section(values, repo_schema(), ["train"])

    def in_steps(self, n_captions: int) -> TrainConfig:
        """This config with `epochs` / `warmup_epochs` turned into optimiser steps for a run on
        `n_captions` training captions (`steps_per_epoch`); steps at least 1, epochs then None."""
        per_epoch = steps_per_epoch(n_captions, self.batch_size, self.grad_accum)
        steps = self.steps if self.epochs is None else max(1, round(self.epochs * per_epoch))
        warmup = self.warmup_steps
        if self.warmup_epochs is not None:
            warmup = round(self.warmup_epochs * per_epoch)
        return dataclasses.replace(
            self, steps=steps, warmup_steps=warmup, epochs=None, warmup_epochs=None
        )

    @classmethod
    def from_dict(cls, d: dict, where: str = "train") -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise DistinctcapError(unknown_key(where, unknown, sorted(known)))
        return cls(**d)


# ---------------------------------------------------------------------------------------------
# The evaluate section


@dataclass
class EvalSettings:
    """The metric keys of the `evaluate:` config block, with the schema's defaults
    (workflow/schemas/sections/evaluate.yaml), plus the config's seed and the device. The
    judge CLIP is not one of them: its columns are scored from its features file, and its
    settings are `JudgeSettings`."""

    oracle_ns: list[int] = from_schema("evaluate", "oracle_ns")
    curve_ns: list[int] = from_schema("evaluate", "curve_ns")
    best_of: int = from_schema("evaluate", "best_of")
    consensus_neighbours: int = from_schema("evaluate", "consensus_neighbours")
    retrieval_ks: list[int] = from_schema("evaluate", "retrieval_ks")
    hard_pool: int = from_schema("evaluate", "hard_pool")
    gpt2_path: str | None = from_schema("evaluate", "gpt2_path")
    spice: bool = from_schema("evaluate", "spice")
    meteor_memory: str = from_schema("evaluate", "meteor_memory")
    self_retrieval_pool: int = from_schema("evaluate", "self_retrieval_pool")
    self_retrieval_ks: list[int] = from_schema("evaluate", "self_retrieval_ks")
    self_retrieval_of_samples: bool = from_schema("evaluate", "self_retrieval_of_samples")
    seed: int = from_schema("seed")
    batch_size: int = from_schema("evaluate", "batch_size")
    device: str = "cpu"  # a resolved device (the config's `device` may say auto)

    @classmethod
    def from_config(cls, block: dict, **extra: object) -> EvalSettings:
        """Settings from a config block; keys other than the fields (gallery, judge, ...) are
        ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in {**block, **extra}.items() if k in names})


# an evaluate key the metrics depend on besides EvalSettings' fields: the judge, whose columns
# the evaluate jobs score from its features (JudgeSettings)
JUDGE_KEY = "judge"


def metric_block(block: dict) -> dict:
    """The keys of an `evaluate:` block the metrics depend on (not the gallery's), so that
    editing a report-only key does not rerun every evaluation."""
    names = {f.name for f in fields(EvalSettings)} | {JUDGE_KEY}
    return {k: v for k, v in block.items() if k in names}


# ---------------------------------------------------------------------------------------------
# The judge CLIP (evaluate.judge; docs/report.md, "The judge CLIP")


@dataclass(frozen=True)
class JudgeSettings:
    """evaluate.judge, filled with the schema's defaults: a CLIP of its own that only the
    evaluation reads (its judge_* columns), never a training rule, a checkpoint selection or an
    objective. `train` holds clip.train's keys (train.clip.TrainSettings), for pretrained =
    train, as the trainer CLIP's do."""

    arch: str
    pretrained: str = from_schema("evaluate", "judge", "pretrained")
    tag: str | None = None  # the schema gives it no default
    seed: int = from_schema("evaluate", "judge", "seed")
    train: dict = from_schema("evaluate", "judge", "train")

    @property
    def trained(self) -> bool:
        """Does the pipeline train it (rule train_judge_clip)?"""
        return self.pretrained == "train"

    @classmethod
    def from_config(cls, config: dict) -> JudgeSettings | None:
        """The judge of a validated config; None when evaluate.judge is null or absent."""
        block = (config.get("evaluate") or {}).get(JUDGE_KEY)
        return cls(**block) if block else None
