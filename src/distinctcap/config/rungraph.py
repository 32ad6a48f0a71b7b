"""The run graph (ARCHITECTURE.md, "Runs are data"): each run's init / teacher / reference edges
checked, runs over seeds expanded into one model per seed (docs/seeds.md), `only_runs`
selected, and each run's effective config, what determines its result.

What a method requires of its edges is read from its facts class (distinctcap.methods.facts),
the metrics it may select on from the selection registry (distinctcap.train.select_metrics).
Nothing here imports torch: the workflow calls it while Snakemake parses.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.run import RUN_EDGES
from distinctcap.core.settings import TrainConfig
from distinctcap.core.validation import check_against, check_section
from distinctcap.methods.facts import FACTS
from distinctcap.train.select_metrics import select_metrics_of

REQUIRED_EDGES = {method: facts.edges for method, facts in FACTS.items()}


def check_runs(runs: dict) -> None:
    """Every init/teacher/reference names a defined run, and the runs form no cycle."""
    for name, run in runs.items():
        for edge in REQUIRED_EDGES.get(run.get("method"), ()):
            if not run.get(edge):
                raise DistinctcapError(
                    f"runs.{name}.{edge} is required for method {run['method']!r}: "
                    f"name one of the runs {', '.join(sorted(runs))}"
                )
        for edge in RUN_EDGES:
            target = run.get(edge)
            if target is not None and target not in runs:
                raise DistinctcapError(
                    f"runs.{name}.{edge} = {target!r} names no run; defined runs: "
                    f"{', '.join(sorted(runs))}"
                )
    for name in runs:
        cycle = _find_cycle(runs, name, [])
        if cycle:
            raise DistinctcapError(f"runs form a cycle: {' -> '.join(cycle)}")


def _find_cycle(runs: dict, name: str, path: list[str]) -> list[str] | None:
    if name in path:
        return path[path.index(name):] + [name]
    for target in run_dependencies(runs[name]):
        cycle = _find_cycle(runs, target, path + [name])
        if cycle:
            return cycle
    return None


def run_dependencies(run: dict) -> Iterator[str]:
    """The runs this run needs trained first (its DAG edges)."""
    for edge in RUN_EDGES:
        if run.get(edge):
            yield run[edge]


# ---------------------------------------------------------------------------------------------
# Seeds: one run trained once per seed (issue 34; docs/seeds.md)


@dataclass(frozen=True)
class SeedRun:
    """One trained model of a configured run: the run (`arm`), its seed and its run block (the
    arm's, with `seeds` dropped, `seed` where it differs from the top-level one, and each
    init / teacher / reference naming the parent's model of the same seed)."""

    arm: str
    seed: int
    block: dict


def seed_name(run: str, seed: int, seeds: list[int]) -> str:
    """The model name (its folder under results/runs/) of `run`'s seed `seed`: the run's own
    name for its first seed, so one seed keeps today's paths, else <run>_s<seed>."""
    return run if seed == seeds[0] else f"{run}_s{seed}"


def run_seeds(config: dict) -> tuple[dict[str, list[int]], set[str]]:
    """(seeds of each run, the runs trained over a `seeds` list). A run's seeds: its `seeds`,
    else its own `seed` (one, pinned), else the top-level `seeds`, else the top-level `seed`.
    A run over a `seeds` list makes its parents train for those seeds too (transitively); a
    run without one keeps its edges as written (its parents' first seed)."""
    runs = config.get("runs", {})
    top = config.get("seeds")
    seeds, listed = {}, set()
    for name, run in runs.items():
        if "seed" in run and "seeds" in run:
            raise DistinctcapError(f"runs.{name}: give seed or seeds, not both")
        own = run.get("seeds") or ([run["seed"]] if "seed" in run else top)
        seeds[name] = list(own or [config.get("seed", 0)])
        if run.get("seeds") or ("seed" not in run and top):
            listed.add(name)
    for name in _children_first(runs):
        for parent in (run_dependencies(runs[name]) if name in listed else ()):
            _add_parent_seeds(runs, seeds, parent, name)
            if "seed" not in runs[parent]:
                listed.add(parent)
    return seeds, listed


def _add_parent_seeds(runs: dict, seeds: dict, parent: str, child: str) -> None:
    missing = [s for s in seeds[child] if s not in seeds[parent]]
    if missing and "seed" in runs[parent]:
        raise DistinctcapError(
            f"runs.{parent}.seed = {runs[parent]['seed']} pins one seed, but run {child!r} "
            f"reads it over seeds {seeds[child]}: give runs.{parent} `seeds` instead"
        )
    seeds[parent] += missing


def _children_first(runs: dict) -> list[str]:
    """Run names ordered so that every run comes before the runs it reads."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name not in order:
            for parent in run_dependencies(runs[name]):
                visit(parent)
            order.append(name)

    for name in runs:
        visit(name)
    return order[::-1]


def seed_runs(config: dict) -> dict[str, SeedRun]:
    """Every trained model of a validated config by its name (`seed_name`): one per run and
    seed. With one seed per run (the default) the names and blocks are the config's own."""
    runs = config.get("runs", {})
    seeds, listed = run_seeds(config)
    out: dict[str, SeedRun] = {}
    for arm, run in runs.items():
        for seed in seeds[arm]:
            name = seed_name(arm, seed, seeds[arm])
            if name in out or (name != arm and name in runs):
                raise DistinctcapError(
                    f"runs.{arm} over seeds {seeds[arm]} trains a model named {name!r}, "
                    "which is also a run of the config: rename one of them"
                )
            block = {k: copy.deepcopy(v) for k, v in run.items() if k != "seeds"}
            if "seed" not in run and seed != config.get("seed", 0):
                block["seed"] = seed
            for edge in RUN_EDGES if arm in listed else ():
                if block.get(edge):
                    block[edge] = seed_name(block[edge], seed, seeds[block[edge]])
            out[name] = SeedRun(arm, seed, block)
    return out


def seeded_runs(config: dict) -> dict[str, dict]:
    """name -> run block of every trained model (`seed_runs`): the DAG's runs."""
    return {name: run.block for name, run in seed_runs(config).items()}


def selected_runs(config: dict) -> dict:
    """The `runs` this config builds: those named in `only_runs` and the runs they depend on
    (init, teacher, reference), in config order; every run when `only_runs` is empty."""
    runs, wanted = config.get("runs", {}), list(config.get("only_runs") or [])
    unknown = [name for name in wanted if name not in runs]
    if unknown:
        raise DistinctcapError(
            f"only_runs: {', '.join(unknown)} names no run; defined runs: {', '.join(sorted(runs))}"
        )
    if not wanted:
        return runs
    keep: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name not in keep:
            keep.add(name)
            wanted.extend(run_dependencies(runs[name]))
    return {name: block for name, block in runs.items() if name in keep}


def check_dropped_runs(config: dict, sources: Sequence[tuple[str, dict]]) -> None:
    """No run that a source (a config file, or --config) adds after the last source that sets
    `only_runs` is dropped by it: such a run would be silently neither built nor reported
    (a new run in an overlay over presets/quick.yaml). Runs defined before, or in the file that
    sets `only_runs` itself, are left out on purpose; to leave out a new run, set `only_runs`
    in its own file."""
    wanted = config.get("only_runs") or []
    setters = [k for k, (_, content) in enumerate(sources) if "only_runs" in (content or {})]
    if not wanted or not setters:
        return
    kept, seen = selected_runs(config), set()
    for k, (source, content) in enumerate(sources):
        for name in (content or {}).get("runs") or {}:
            if k > setters[-1] and name not in seen and name not in kept:
                raise DistinctcapError(
                    f"runs.{name} (added by {source}) is dropped by only_runs = {wanted} "
                    f"(set in {sources[setters[-1]][0]}): name it in only_runs in {source}, "
                    f"e.g. only_runs: [{', '.join([*wanted, name])}]"
                )
            seen.add(name)


# ---------------------------------------------------------------------------------------------
# Config of a run


def effective_run_config(config: dict, name: str, schema: dict | None = None) -> dict:
    """The config that determines run `name`'s result: its block from `runs:` with `train`
    merged over the top-level `train` defaults, plus `seed` (the block's own, else the
    top-level one) and `captioner`. Snakemake passes
    it as a rule param, so editing it reruns exactly this run and the runs that depend on it.
    With the merged config `schema`, the run's `train` overrides are checked against the
    `train` section (unknown keys, wrong types) with a DistinctcapError naming the key."""
    if name not in config.get("runs", {}):
        raise DistinctcapError(
            f"no run named {name!r}; defined runs: {', '.join(sorted(config.get('runs', {})))}"
        )
    block = config["runs"][name]
    overrides = block.get("train", {}) or {}
    train = {**config.get("train", {}), **overrides}
    if schema is not None:
        check_section(train, schema, ["runs", name, "train"])
        _check_run_block(block, schema, name)
    select = TrainConfig.from_dict(train, where=f"runs.{name}.train").select_metric
    allowed = select_metrics_of(block.get("method"))
    if select not in allowed:
        raise DistinctcapError(
            f"runs.{name}.train.select_metric = {select!r}: method {block.get('method')!r} "
            f"selects on one of {sorted(allowed)}"
        )
    run = {k: copy.deepcopy(v) for k, v in block.items() if k != "train"}
    return {
        "name": name,
        **run,
        "seed": block.get("seed", config.get("seed", 0)),
        "captioner": copy.deepcopy(config.get("captioner", {})),
        "train": train,
    }


def _check_run_block(block: dict, schema: dict, name: str) -> None:
    """The run block holds only keys of every run and its own method's options (a block
    edited after `validate`: an option of another method would be silently ignored)."""
    check_against(block, schema["properties"]["runs"]["additionalProperties"], schema,
                  ["runs", name])  # fmt: skip
