"""What each training method is, in one place per method, readable without torch.

A method is three files: its facts (a class here, registered once in `FACTS`), its objective
(a module of distinctcap.methods subclassing the facts with the loss, named by the facts'
`objective_class`, e.g. `class UNKT(facts.UNKT)` in distinctcap.methods.unkt) and its options'
schema, workflow/schemas/methods/<method>.yaml (their defaults, types and meaning; it also
refuses in a run block any option of another method).

Each class here declares one method's facts (the attributes of distinctcap.methods.base.
Objective: required run edges, frozen runs the trainer loads, what the loss averages over, its
own selection metrics, the extra inputs a run needs, where its objective is); the objective
declares none of these attributes itself (tests/test_config.py).

Why not declare them on the loss classes: those modules import torch, and the facts are read
while Snakemake parses the workflow (config.check.validate, config.rungraph.effective_run_config,
workflow/rules/common.smk), which must stay light (a torch import costs seconds per dry run).
Importing this module imports no torch; `FACTS` maps each run `method` to its class, and
distinctcap.methods.METHODS, derived from it, to the trainable subclass.

`FACTS` holds the built-ins (`BUILTIN_FACTS`) and the installed method plugins
(distinctcap.core.plugins), built on first access (PEP 562 module `__getattr__`), so a
plugin's facts module may import this one. A registration missing one of its three parts is
left out of `FACTS` and named, one line, by `check_registry` (config.check.validate, before any
job runs).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.plugins import MethodPlugin, method_plugins
from distinctcap.core.schema import builtin_method_names, method_options, usable_plugins
from distinctcap.methods.base import Objective

if TYPE_CHECKING:
    FACTS: dict[str, type[Objective]]


class MLE(Objective):
    """Maximum likelihood (UNKT eq. 1): the reference of every other method."""

    options = method_options("mle")
    objective_class = "distinctcap.methods.mle:MLE"


class UNKT(Objective):
    """UNKT eq. 9 against the frozen negative teacher (UNKT §3.2-3.3)."""

    edges = ("teacher",)
    needs = ("teacher",)
    options = method_options("unkt")
    objective_class = "distinctcap.methods.unkt:UNKT"

    @classmethod
    def step_cost(cls, run: dict) -> float:
        """The frozen teacher's forward beside the student's step (bench_unkt: 1.47x)."""
        return 1.5

    @classmethod
    def extra_inputs(cls, run: dict) -> dict[str, str | float | None]:
        """Random targets (Table 6) draw from the D- captions."""
        return {"d_minus": "D-"} if run.get("targets") == "random" else {}

    @classmethod
    def option_conflicts(cls, run: dict) -> dict[str, str]:
        """Options that another option would make silently ignored: top_k narrows the soft
        targets of eq. 5 (hard and random targets have one token a position); exclude_gold
        needs the gold caption's token, which the teacher's own captions do not have;
        negative_decoding and negative_samples choose how the teacher makes its captions, for
        soft targets under negative_captions: teacher only (hard targets are its greedy
        caption, random ones D- captions)."""
        opt = {**cls.options, **run}
        targets, reading = opt["targets"], opt["negative_captions"]
        conflicts = {}
        if opt["top_k"] is not None and targets != "soft":
            conflicts["top_k"] = (
                f"keeps the teacher's top k of the soft targets of eq. 5, but this run "
                f"has targets: {targets}; set top_k: null or targets: soft"
            )
        if opt["exclude_gold"] and reading == "teacher":
            conflicts["exclude_gold"] = (
                "leaves the gold token out of eq. 5, but negative_captions: teacher reads the "
                "teacher's own captions, which have none; set exclude_gold: false"
            )
        generated = reading == "teacher" and targets == "soft"
        if opt["negative_decoding"] != "greedy" and not generated:
            conflicts["negative_decoding"] = (
                f"makes the teacher's captions of negative_captions: teacher with soft "
                f"targets, but this run has negative_captions: {reading}, targets: {targets}; "
                "set negative_decoding: greedy"
            )
        if opt["negative_samples"] != 1 and opt["negative_decoding"] != "sample":
            conflicts["negative_samples"] = (
                "counts the captions of negative_decoding: sample; set negative_samples: 1 "
                "or negative_decoding: sample"
            )
        return conflicts


class CL(Objective):
    """Contrastive Learning (Dai & Lin 2017, §4.2, eq. 7-10): a target initialised from, and
    compared with, a frozen reference run."""

    edges = ("init", "reference")
    needs = ("reference",)
    options = method_options("cl")
    objective_class = "distinctcap.methods.cl:ContrastiveLearning"
    mean_over = "captions"  # eq. 10 averages over captions: multi-GPU shards weigh by count

    @classmethod
    def step_cost(cls, run: dict) -> float:
        """Each row's caption and its K negatives through the target and the reference: the
        step alone measured 4.2-4.65x at K = 5 (bench_cl_smile), its CIDEr-D validation more
        (8.3x an MLE step all told in the shapes default), so 1 + K."""
        return 1.0 + int(run.get("negatives", cls.options["negatives"]))


class SMILE(Objective):
    """Semipermeable MLE (Yue et al. 2023, §2.2, eq. 2-4) from an initial MLE run."""

    edges = ("init",)
    options = method_options("smile")
    objective_class = "distinctcap.methods.smile:SMILE"
    # §3.3: checkpoints chosen on CLIP self-retrieval on the validation set (R@1)
    val_metrics = {"clip_self_retrieval": "max"}

    @classmethod
    def extra_inputs(cls, run: dict) -> dict[str, str | float | None]:
        """The CLIP, for selection on validation CLIP self-retrieval (§3.3)."""
        return {"clip": None}


class Specificity(Objective):
    """Retrieval-guided specificity (specificity paper §3.2-3.3, eq. 2-5, §4) through a frozen
    CLIP, from an initial MLE run."""

    edges = ("init",)
    options = method_options("specificity")
    objective_class = "distinctcap.methods.specificity:Specificity"
    # eq. 5 averages over captions, so multi-GPU shards weigh by caption count (with
    # mle_weight > 0 the token-mean MLE term is then weighted by captions, a close approximation)
    mean_over = "captions"
    # the validation mean rank through its CLIP (§4, "early stopping ... lowest mean rank")
    val_metrics = {"mean_rank": "min"}

    @classmethod
    def step_cost(cls, run: dict) -> float:
        """Greedy decoding and the CLIP's text tower beside the step (bench_specificity: 1.8x
        with the tiny CLIP)."""
        return 1.8

    @classmethod
    def extra_inputs(cls, run: dict) -> dict[str, str | float | None]:
        """The CLIP (text tower) always; the neighbours table for the contrastive losses."""
        needs: dict[str, str | float | None] = {"clip": None}
        if run.get("loss", cls.options["loss"]) in ("cdp", "ccos"):
            needs["neighbours"] = run.get("contrastive_top_pct", cls.options["contrastive_top_pct"])
        return needs


class SCST(Objective):
    """Self-critical sequence training (Rennie et al. 2017 eq. 9; ruotianluo's "new SCST"
    baseline) with CIDEr-D, retrieval (Luo et al. 2018) and CLIPScore rewards, from an
    initial run (edge init)."""

    edges = ("init",)
    options = method_options("scst")
    objective_class = "distinctcap.methods.scst:SCST"
    # 2: the CIDEr-D reward counts the end token (cider_end_token, issue 58)
    version = 2
    # the loss is a mean over the sampled tokens of the micro-batch's images, which a shard
    # of its captions holds in proportion to its captions (a close approximation)
    mean_over = "captions"

    @classmethod
    def settings(cls, run: Mapping) -> dict:
        """The run's options over their defaults, `rewards` merged weight by weight (a block may
        name some weights only): the one merge of SCST's defaults, read by the facts and the
        objective (methods.scst)."""
        opts = {key: run.get(key, default) for key, default in cls.options.items()}
        opts["rewards"] = {**cls.options["rewards"], **(run.get("rewards") or {})}
        return opts

    @classmethod
    def extra_inputs(cls, run: dict) -> dict[str, str | float | None]:
        """The CLIP, for the retrieval and CLIPScore rewards when either weighs > 0."""
        weights = cls.settings(run)["rewards"]
        return {"clip": None} if weights["retrieval"] or weights["clipscore"] else {}

    @classmethod
    def option_conflicts(cls, run: dict) -> dict[str, str]:
        """The new SCST baseline averages the image's other samples: it needs k >= 2."""
        opt = cls.settings(run)
        if opt["baseline"] == "new" and opt["k"] < 2:
            return {"k": "baseline new averages an image's other samples; set k >= 2 or "
                         "baseline: greedy"}
        return {}

    @classmethod
    def step_cost(cls, run: dict) -> float:
        """K sampled captions an image and their rewards beside the step (bench_scst: 1.54x
        at K = 5)."""
        return 1.5


BUILTIN_FACTS: dict[str, type[Objective]] = {
    "mle": MLE,
    "unkt": UNKT,
    "cl": CL,
    "smile": SMILE,
    "specificity": Specificity,
    "scst": SCST,
}


@dataclass(frozen=True)
class Registry:
    """The registered methods (`facts`) and, one line each, the registrations left out."""

    facts: dict[str, type[Objective]]
    problems: tuple[str, ...]


def __getattr__(name: str) -> dict[str, type[Objective]]:
    if name != "FACTS":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    facts = registry().facts
    globals()["FACTS"] = facts  # later lookups find the dict itself
    return facts


@functools.cache
def registry() -> Registry:
    """The built-in methods and the usable plugins, with what is wrong with the others."""
    facts, problems = {}, []
    builtins = builtin_method_names()
    for name in builtins:
        if name not in BUILTIN_FACTS:
            problems.append(
                f"method {name!r} has an options schema (schemas/methods/{name}.yaml) but no "
                "facts class: register it in distinctcap.methods.facts.BUILTIN_FACTS"
            )
    for name, cls in BUILTIN_FACTS.items():
        problem = objective_problem(f"method {name!r}", cls)
        if problem:
            problems.append(problem)
        else:
            facts[name] = cls
    usable = usable_plugins(builtins)
    for plugin in method_plugins():
        if plugin in usable:
            cls, problem = load_plugin(plugin)
        else:
            cls, problem = None, plugin_problem(plugin, builtins)
        if problem:
            problems.append(problem)
        else:
            facts[plugin.name] = cls
    return Registry(facts, tuple(problems))


def check_registry() -> None:
    """Raise the first registration that misses a part, in one line naming it."""
    problems = registry().problems
    if problems:
        raise DistinctcapError(problems[0])


def plugin_problem(plugin: MethodPlugin, builtins: tuple[str, ...]) -> str:
    """Why `plugin` is not among the usable plugins: its name or its schema file."""
    if plugin.name in builtins:
        return (f"{plugin.label}: its name is a built-in method's; rename its entry point in "
                "group distinctcap.methods")  # fmt: skip
    others = [p.dist for p in method_plugins() if p.name == plugin.name and p != plugin]
    if others:
        return f"{plugin.label}: package {others[0]} registers the same method name"
    where = plugin.schema_file()
    if where is None:
        return f"{plugin.label}: its package {plugin.package!r} is not importable"
    return (f"{plugin.label} has no options schema: ship {where} as package data (an empty "
            "method: `type: object` and `properties: {}`)")  # fmt: skip


def load_plugin(plugin: MethodPlugin) -> tuple[type[Objective] | None, str | None]:
    """(its facts class, None), or (None, what is missing)."""
    module, _, name = plugin.value.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except Exception as error:  # noqa: BLE001 - any failure of a third-party import is named
        return None, f"{plugin.label}: its facts {plugin.value} do not load: {error!r}"
    if not (isinstance(cls, type) and issubclass(cls, Objective)):
        return None, (f"{plugin.label}: its facts {plugin.value} are not a subclass of "
                      "distinctcap.methods.base.Objective")  # fmt: skip
    return cls, objective_problem(plugin.label, cls)


def objective_problem(label: str, cls: type[Objective]) -> str | None:
    """What is wrong with the objective the facts `cls` name, found without importing it (its
    module imports torch): no `objective_class`, or a module that is not installed."""
    module, _, name = cls.objective_class.partition(":")
    if not module or not name:
        return (f"{label} has no objective: set {cls.__name__}.objective_class to the "
                '"module:Class" of its loss')  # fmt: skip
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:
        found = False
    if not found:
        return f"{label}: its objective_class {cls.objective_class!r} names no installed module"
    return None


def method_version(run: Mapping) -> dict:
    """What train_run and run_card record of a run's method version (`Objective.version`):
    nothing at version 1, as core.params.stage_version, so introducing it retrained nothing;
    the value names the method."""
    method = run.get("method", "mle")
    version = registry().facts[method].version
    return {} if version == 1 else {"method_version": f"{method} version {version}"}
