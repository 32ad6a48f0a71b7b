"""A config fuzzer (issue 28): configs drawn from the schema, with values at and past every edge
(0, negative, NaN, infinities, huge, empty and path-like strings, wrong types, unknown keys,
names that collide), either pass the check and plan, or stop with one line naming a key, never
a traceback.

Each drawn config is the tiny test config with one to three changes. `validate` and every run's
`effective_run_config` (what common.smk does while Snakemake parses) run on each; a sample of
those that pass is planned with Snakemake's Python API in this process (`snakemake -n` costs a
10 s start per config on the 2-core box, the API 1.5 s after the first). Seeded, so CI draws
the same configs every time.
"""

from __future__ import annotations

import copy
import math
import os
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, tiny_config
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from distinctcap.config.check import load_schema, validate
from distinctcap.config.priorities import entropy_priority, run_priorities
from distinctcap.config.rungraph import effective_run_config, seeded_runs
from distinctcap.core.errors import DistinctcapError

SCHEMA = load_schema(ROOT / "workflow" / "schemas" / "config.schema.yaml")
EXAMPLES = 300
PLANNED = 6  # passing configs planned with Snakemake, spread over the examples

EDGE_VALUES = [
    0, -1, 1, 2, 10**12, 2**63, 0.5, -0.5, 1e308, math.nan, math.inf, -math.inf,
    "", " ", "../../x", "a/b", "/abs/path", "x" * 300, "ünï", None, True, False, [], [0], {},
    {"zz": 1},
]
NAMES = ["greedy", "greedy-per_image", "Greedy", "reference", "Reference", "x/../../../ESCAPED",
         "..", "-x", "a b", "a.b", "", "n" * 65, "ok_1", "ok-2"]


def key_paths(schema: dict, config: dict, prefix: tuple = ()) -> list[tuple[tuple, dict]]:
    """(key path, its schema) of every key the config can set, the runs' and decodings' own
    keys under the names the config has."""
    paths = []
    for name, sub in schema.get("properties", {}).items():
        path = (*prefix, name)
        paths.append((path, sub))
        if name in ("runs", "decoding") and not prefix:
            for entry in config.get(name, {}):
                paths += _entry_paths(sub["additionalProperties"], (name, entry))
        elif sub.get("type") == "object":
            paths += key_paths(sub, config, path)
    return paths


def _entry_paths(block: dict, prefix: tuple) -> list[tuple[tuple, dict]]:
    props = dict(block["properties"])
    for branch in block.get("allOf", []):  # each method's options
        props.update(branch["then"]["properties"])
    return [((*prefix, name), sub) for name, sub in props.items()]


NUMBER_EDGES = [0, -1, 1, 10**12, 0.5, 1e308, math.nan, math.inf, -math.inf]


def values_for(sub: dict) -> st.SearchStrategy:
    """Edge values (those of a number for a numeric key, half the time), plus the schema's own
    allowed values and default for the key."""
    own = list(sub.get("enum", [])) + ([sub["default"]] if "default" in sub else [])
    numeric = {"number", "integer"} & set(_types(sub))
    return st.one_of(st.sampled_from(NUMBER_EDGES if numeric else EDGE_VALUES),
                     st.sampled_from(EDGE_VALUES + own))


def _types(sub: dict) -> list[str]:
    kind = sub.get("type", "integer" if "$ref" in sub else [])  # refs: positive_int
    return [kind] if isinstance(kind, str) else kind


TINY = tiny_config()
PATHS = key_paths(SCHEMA, TINY)
SECTIONS = sorted({path[0] for path, _ in PATHS})  # drawn first: runs has most keys
NUMERIC_PATHS = [(p, s) for p, s in PATHS if {"number", "integer"} & set(_types(s))]


@st.composite
def changes(draw) -> tuple[dict, list[tuple]]:
    """The tiny config with one to three changes, and the key paths changed."""
    config = copy.deepcopy(TINY)
    changed = []
    for _ in range(draw(st.sampled_from([1, 1, 2, 3]))):  # one change: the most pass
        kind = draw(st.sampled_from(["set"] * 3 + ["number"] * 3 + ["unknown", "name", "delete"]))
        if kind == "name":
            section = draw(st.sampled_from(["runs", "decoding"]))
            name = draw(st.sampled_from(NAMES))
            entry = {"method": draw(st.sampled_from(["mle", "smile", "unkt", "x"]))}
            if section == "decoding":
                entry = {"kind": draw(st.sampled_from(["greedy", "beam", "sample"]))}
            config.setdefault(section, {})[name] = entry
            changed.append((section, name))
            continue
        if kind == "number":  # a numeric key anywhere, at a numeric edge
            path, sub = draw(st.sampled_from(NUMERIC_PATHS))
            value = st.sampled_from(NUMBER_EDGES)
        else:
            section = draw(st.sampled_from(SECTIONS))
            path, sub = draw(st.sampled_from([(p, s) for p, s in PATHS if p[0] == section]))
            value = values_for(sub)
        parent = _parent(config, path)
        if parent is None:
            continue
        if kind in ("set", "number"):
            parent[path[-1]] = draw(value)
        elif kind == "unknown":
            parent["zz_unknown"] = 1
            path = (*path[:-1], "zz_unknown")
        else:
            parent.pop(path[-1], None)
        changed.append(path)
    return config, changed


def _parent(config: dict, path: tuple) -> dict | None:
    node = config
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return None
    return node


def check(config: dict) -> dict:
    """What the workflow does with a config while Snakemake parses it (common.smk)."""
    config = validate(config, SCHEMA)
    seeded = {**config, "runs": seeded_runs(config)}  # one model per run and seed
    runs = {name: effective_run_config(seeded, name, SCHEMA) for name in seeded["runs"]}
    entropy_priority(runs, run_priorities(runs))
    return config


def test_drawn_configs_pass_and_plan_or_stop_with_one_line_naming_a_key(tmp_path):
    passing: list[dict] = []

    @seed(28)
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(changes())
    def drawn(case):
        config, changed = case
        try:
            checked = check(config)
        except DistinctcapError as error:
            message = str(error)
            assert "\n" not in message, message
            named = {str(part) for path in changed for part in path[:2]}
            assert any(part and part in message for part in named) or "<top level>" in message, (
                f"{message!r} names none of {sorted(named)}"
            )
        else:
            assert_meaningful(checked)
            passing.append(checked)

    drawn()
    print(f"{len(passing)} of {EXAMPLES} drawn configs passed the check")
    assert len(passing) >= PLANNED, len(passing)
    step = len(passing) // PLANNED
    for i, config in enumerate(passing[::step][:PLANNED]):
        plan(config, tmp_path / str(i))


def assert_meaningful(config: dict) -> None:
    """What a passing config must not hold (the probe's holes): a number that is not finite,
    or outputs (decode.smk, evaluate.smk) outside results/ or two of them at one path."""
    numbers = list(_numbers(config))
    assert all(math.isfinite(x) for x in numbers), numbers
    paths = [
        f"results/{stage}/{run}/{split}-{name}{suffix}"
        for run in config["runs"]
        for name, setting in config["decoding"].items()
        for split in setting["splits"]
        for stage, suffix in [("generated", ".parquet"), ("metrics", ".parquet"),
                              ("metrics", "-cider_vs_n.csv"), ("metrics", "-per_image.parquet")]
    ] + [f"results/runs/{run}" for run in config["runs"]]
    assert all(os.path.normpath(p).startswith("results/") for p in paths), paths
    folded = [p.casefold() for p in paths]
    assert len(set(folded)) == len(folded), paths


def _numbers(value):
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            yield from _numbers(item)
    elif isinstance(value, float):
        yield value


def plan(config: dict, workdir: Path) -> None:
    """`snakemake -n` of the config, through Snakemake's API in this process."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import DAGSettings, OutputSettings, ResourceSettings

    workdir.mkdir()
    for name in ("Snakefile", "workflow", "envs"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, workdir / name)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    try:
        with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
            workflow = api.workflow(
                resource_settings=ResourceSettings(cores=1),
                snakefile=workdir / "Snakefile",
                workdir=workdir,
            )
            workflow.dag(DAGSettings()).execute_workflow(executor="dryrun")
    except SystemExit as error:  # common.smk's config error
        pytest.fail(f"a config that passed the check stopped the workflow: exit {error.code}")
