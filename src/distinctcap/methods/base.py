"""The contract between the trainer and a training method (ARCHITECTURE.md, "Runs are data").

The trainer (distinctcap.train.trainer) owns the loop: data order, optimiser, schedule, precision,
accumulation, validation, checkpoints. An objective only turns a batch into a loss. A method is
one `Objective` subclass; everything the config checker, the workflow and the trainer need to
know about it is a class attribute declared here with its default:

    edges        run edges a run of this method must name, among "init", "teacher",
                 "reference" (config.rungraph.check_runs); e.g. cl: ("init", "reference")
    needs        the edges whose final models the trainer loads frozen into ctx.frozen
    options      its own run options -> their defaults, read from its own schema
                 (<top-level package>/schemas/methods/<method>.yaml: distinctcap's own in
                 src/distinctcap/schemas/methods/, a plugin's in its package), which refuses
                 other options
    mean_over    "tokens" | "captions": what its loss averages over, so multi-GPU shards are
                 weighted right (distinctcap.core.distributed.shard_weight); an instance sets its
                 own where a run option changes it (unkt token_reduction: sum)
    val_metrics  {name: "min" | "max"} selection metrics it computes itself (`val_metric`)
    extra_inputs(run)  named inputs a run block needs beyond data, features and edge models,
                 {need: parameter}: "d_minus" (an entropy subset, "D-"), "clip" (None: the
                 configured CLIP), "neighbours" (the table's percentage). The workflow
                 (workflow/rules/common.smk) maps each need to the trainer's inputs
                 (RunPaths.inputs, which the objective reads as ctx.paths).
    option_conflicts(run)  {option: why} for its options set where the run's other options
                 make them meaningless (config.check.check_values names runs.<name>.<option>)
    objective_class  "module:Class" of its trainable subclass, the one with the loss;
                 the facts' registry `facts.FACTS` is the one list of methods, and
                 distinctcap.methods.METHODS is derived from it through `trainable()`
    version      what its runs compute from the same config: raise it when a release changes
                 that on purpose (a new option's default that changes the loss) and say so in
                 CHANGELOG.md; its runs then retrain once, and the other methods' do not
                 (`facts.method_version`, recorded with the run by train_run and run_card)

and, per instance:

    __init__(run, ctx)        run is the run's effective config as a
                              distinctcap.core.run.RunConfig (name, seed, train, its method's
                              `options`, ...)
    loss(model, batch, step, total_steps) -> (scalar loss of one micro-batch, extras for the
                              curve, e.g. {"lambda": 0.3}: numbers, or detached 0-dim tensors,
                              which the trainer reads only at log steps, so computing them
                              costs no host sync); `step` counts optimiser steps from 0 to
                              total_steps - 1; the trainer scales the loss for accumulation
                              and runs backward
    val_metric(name, model, val_data, val_batches, autocast) -> float, for `val_metrics`
    state_dict() / load_state_dict(state)   state beyond the model that an exact resume needs
                              (e.g. CL's replaced reference): tensors, numbers, strings, lists
                              and dicts; the trainer keeps it in its checkpoints

- `ctx.frozen[edge]` is the final model of the run named by the run's `edge` for each edge in
  `needs`, in eval mode, with requires_grad False, on `ctx.device`; `ctx.paths` are the run's
  inputs by name (e.g. "d_minus", "clip", "clip_arch", "neighbours").
- `batch` is a distinctcap.features.batches.Batch already on the device; the objective runs the
  model itself (under the trainer's autocast), so it can ask for internals (UNKT eq. 7-8) or
  score other captions (CL). `ctx.train_data` gives access to every training pair, e.g. to
  draw mismatched images for CL's negatives.

This module imports no torch, so the facts can be read while Snakemake parses the workflow;
the methods' facts are declared in distinctcap.methods.facts for the same reason.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from distinctcap.core.errors import DistinctcapError

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch import Tensor

    from distinctcap.captioner.model import Captioner
    from distinctcap.core.run import RunConfig
    from distinctcap.features.batches import Batch, CaptionData

@dataclass
class TrainContext:
    device: torch.device
    train_data: CaptionData
    frozen: dict[str, Captioner] = field(default_factory=dict)  # "teacher"/"reference" -> model
    tokenizer: object | None = None  # distinctcap.data.tokenizer.CaptionTokenizer when known
    pad_id: int = 0
    paths: Mapping[str, object] = field(default_factory=dict)  # the run's inputs (RunPaths)


class Objective:
    """A training method: its facts (class attributes, see the module doc) and its loss."""

    edges: ClassVar[tuple[str, ...]] = ()
    needs: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[Mapping[str, object]] = {}
    mean_over: ClassVar[str] = "tokens"
    val_metrics: ClassVar[Mapping[str, str]] = {}
    objective_class: ClassVar[str] = ""
    version: ClassVar[int] = 1

    @classmethod
    def trainable(cls) -> type[Objective]:
        """The method's trainable class, named by `objective_class` ("module:Class");
        imported only here, so reading the facts imports no torch."""
        module, _, name = cls.objective_class.partition(":")
        return getattr(importlib.import_module(module), name)

    @classmethod
    def extra_inputs(cls, run: dict) -> dict[str, str | float | None]:
        """Named inputs run block `run` (schema defaults filled) needs: {need: parameter}."""
        return {}

    @classmethod
    def option_conflicts(cls, run: dict) -> dict[str, str]:
        """{option: why} for the options of run block `run` (schema defaults filled) that its
        other options make meaningless; empty when there are none."""
        return {}

    @classmethod
    def refuse_conflicts(cls, name: str, run: Mapping) -> None:
        """Raise the first of `option_conflicts(run)` as one line naming the key, for run
        `name` (the config check, config.check.check_run_options, and an objective built from
        a run that no config check saw)."""
        for key, why in cls.option_conflicts(dict(run)).items():
            raise DistinctcapError(f"runs.{name}.{key} = {run.get(key)!r}: {why}")

    @classmethod
    def step_cost(cls, run: dict) -> float:
        """An optimiser step of run block `run` against an MLE step of the same batch: the
        scheduler's estimate of a run's training time (config.priorities.run_priorities), from the
        step benchmarks of docs/performance.md."""
        return 1.0

    def __init__(self, run: RunConfig, ctx: TrainContext) -> None:
        pass

    def loss(
        self, model: Captioner, batch: Batch, step: int, total_steps: int
    ) -> tuple[Tensor, dict[str, float]]:
        raise NotImplementedError

    def selectable(self, step: int, total_steps: int) -> bool:
        """May the weights after `step` of `total_steps` optimiser steps be selected? (The
        validation is logged either way.)"""
        return True

    def val_metric(
        self,
        name: str,
        model: Captioner,
        val: CaptionData,
        batches: list | None = None,
        autocast: Callable | None = None,
    ) -> float:
        raise DistinctcapError(
            f"{type(self).__name__} computes {sorted(self.val_metrics) or 'no metric'}, "
            f"not {name!r}"
        )

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
