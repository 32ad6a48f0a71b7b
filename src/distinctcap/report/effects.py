"""The effects the README reports on the shapes default, and SCST's (issue 49, presets/scst.yaml),
each judged across training seeds (issue 34, docs/seeds.md).

Each table also has, for every method, its CIDErBtw below the reference's and its DisWordRate
above (issue 58, `field_effects`). An effect is "run's metric above that of `than`" (below, for
a lower-better metric: report.judged.LOWER_BETTER) under one decoding on the test split. Per
seed, the difference is the run's value minus `than`'s of the same seed (summary.csv). An
effect holds across seeds where every seed shows it and, for the metrics versus_reference
compares with the reference, where its interval over seeds and images (versus.csv, the
two-stage bootstrap) also excludes 0. An effect on a trainer-CLIP metric (R@1, mean rank) is
also read by the independent judges (issue 45, report.judged): the same differences per seed
under the judge CLIP and the scene judge, and whether each confirms the gain (`judges_verdict`).

    python -m distinctcap.report.effects results/metrics/summary.csv results/report/versus.csv
    python -m distinctcap.report.effects --scst results/metrics results/report/versus.csv \
        --configs config.yaml presets/scst.yaml     # make scst-table: SCST_EFFECTS
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from distinctcap.core.errors import DistinctcapError
from distinctcap.report.judged import FLAG, gain, judges_of, survives
from distinctcap.report.summary import markdown_table
from distinctcap.report.verdicts import interval


class Effect(NamedTuple):
    claim: str
    run: str
    metric: str
    decoding: str
    than: str = "reference"


def field_effects(runs: tuple[tuple[str, str], ...]) -> tuple[Effect, ...]:
    """For each (run, name): its greedy CIDErBtw below the reference's and its DisWordRate
    above (issue 58; evaluate.distinctive: the similar images by the judge CLIP)."""
    return tuple(
        effect for run, name in runs for effect in (
            Effect(f"{name}: greedy CIDErBtw below the reference's", run, "cider_btw", "greedy"),
            Effect(f"{name}: greedy DisWordRate above the reference's", run, "dis_word_rate",
                   "greedy"),
        )
    )  # fmt: skip


# The ten the README's results paragraph reports: the fine-tunes' and UNKT's gains over the
# MLE reference (CL, SMILE and specificity: quality and distinctiveness; UNKT: also diversity)
# and the entropy split's two teachers.
EFFECTS = (
    Effect("CL: greedy CIDEr above the reference's", "cl", "cider", "greedy"),
    Effect("CL: greedy R@1 above the reference's", "cl", "r_at_1", "greedy"),
    Effect("SMILE: greedy CIDEr above the reference's", "smile", "cider", "greedy"),
    Effect("SMILE: greedy R@1 above the reference's", "smile", "r_at_1", "greedy"),
    Effect("specificity: greedy CIDEr above the reference's", "specificity", "cider", "greedy"),
    Effect("specificity: greedy R@1 above the reference's", "specificity", "r_at_1", "greedy"),
    Effect("UNKT: greedy CIDEr above the reference's", "unkt", "cider", "greedy"),
    Effect("UNKT: greedy R@1 above the reference's", "unkt", "r_at_1", "greedy"),
    Effect("UNKT: Div-2 of 20 samples above the reference's", "unkt", "div2", "sample20"),
    Effect(
        "D+ teacher: greedy R@1 above the D- teacher's",
        "teacher_pos",
        "r_at_1",
        "greedy",
        "teacher_neg",
    ),  # fmt: skip
)
# UNKT's Table 1 claim that the shapes default does not show (docs/unkt-sampled-captions.md)
UNMET = Effect(
    "UNKT: oracle CIDEr-D@20 above the reference's", "unkt", "oracle_cider_20", "sample20"
)
# and, for every method, the field's distinctiveness metrics
README_EFFECTS = (*EFFECTS, UNMET, *field_effects((("cl", "CL"), ("smile", "SMILE"),
                  ("specificity", "specificity"), ("unkt", "UNKT"))))  # fmt: skip
# Issue 49's effects of presets/scst.yaml (make scst): SCST above its MLE init on the metric
# every SCST paper reports, and Luo et al. 2018's retrieval reward raising R@1 over plain SCST,
# which the judge columns read again under the independent judges (issue 45).
SCST_EFFECTS = (
    Effect("SCST: greedy CIDEr above the reference's", "scst", "cider", "greedy"),
    Effect(
        "SCST + retrieval reward: greedy R@1 above plain SCST's",
        "scst_retrieval",
        "r_at_1",
        "greedy",
        "scst",
    ),  # fmt: skip
    *field_effects((("scst", "SCST"), ("scst_retrieval", "SCST + retrieval reward"))),
)
COLUMNS = ["effect", "seeds", "difference per seed", "mean ± sd", "interval (seeds, images)",
           "holds", "judge CLIP per seed", "scene judge per seed", "judges"]  # fmt: skip


def judge_name(column: str) -> str:
    """'judge CLIP' for judge_<metric>, 'scene judge' for scene_<metric> (`judged.judges_of`)."""
    return "judge CLIP" if column.startswith("judge_") else "scene judge"


def seed_differences(summary: pd.DataFrame, effect: Effect, split: str = "test") -> pd.Series:
    """seed -> the run's value minus `than`'s of the same seed (seeds both have)."""
    rows = summary[(summary.split == split) & (summary.decoding == effect.decoding)]
    if effect.metric not in rows:
        return pd.Series(dtype=float)
    if "seed" not in rows:  # a summary from before seeds: one seed
        rows = rows.assign(seed=0)
    values = rows.pivot_table(index="seed", columns="run", values=effect.metric)
    if effect.run not in values or effect.than not in values:
        return pd.Series(dtype=float)
    return (values[effect.run] - values[effect.than]).dropna()


def versus_row(versus: pd.DataFrame | None, effect: Effect, split: str = "test"):
    """The effect's versus.csv row, where versus_reference compares its run and metric."""
    if versus is None or effect.than != "reference":
        return None
    match = versus[(versus.run == effect.run) & (versus.metric == effect.metric)
                   & (versus.decoding == effect.decoding) & (versus.split == split)]  # fmt: skip
    return None if match.empty else match.iloc[0]


def judge(effect: Effect, summary: pd.DataFrame, versus: pd.DataFrame | None) -> list:
    """One row of COLUMNS."""
    diffs = seed_differences(summary, effect)
    if diffs.empty:
        return [effect.claim, 0, "", "", "", "not run", "", "", ""]
    shown = int((gain(effect.metric, diffs) > 0).sum())  # lower CIDErBtw is a gain
    row = versus_row(versus, effect)
    span = "" if row is None else interval(row)
    if shown == len(diffs) and (row is None or row.verdict == "better"):
        holds = "yes"
    elif shown == len(diffs):
        holds = "on every seed, interval includes 0"
    else:
        holds = f"no: on {shown} of {len(diffs)} seeds"
    spread = f"{diffs.mean():+.3f}" + (f" ± {diffs.std():.3f}" if len(diffs) > 1 else "")
    per_seed = ", ".join(f"{d:+.3f}" for d in diffs)
    return [effect.claim, len(diffs), per_seed, spread, span, holds,
            *judges_view(effect, summary, diffs)]


def judges_view(effect: Effect, summary: pd.DataFrame, diffs: pd.Series) -> list[str]:
    """[judge CLIP per seed, scene judge per seed, judges]: the effect's differences per seed
    under each judge of its metric (`judged.judges_of`; '' where that judge was not
    evaluated), and `judges_verdict`."""
    judges = judges_of(effect.metric)
    if not judges:
        return ["", "", "n/a (not a CLIP metric)"]
    seen = {}
    for judge in judges:
        judged = seed_differences(summary, effect._replace(metric=judge))
        if not judged.empty:
            seen[judge] = judged
    cells = {judge_name(j): ", ".join(f"{d:+.3f}" for d in seen[j]) for j in seen}
    return [cells.get("judge CLIP", ""), cells.get("scene judge", ""),
            judges_verdict(effect.metric, diffs, seen)]


def judges_verdict(metric: str, diffs: pd.Series, seen: dict[str, pd.Series]) -> str:
    """Which judges confirm the trainer-CLIP effect (`diffs`, per seed): each judge whose mean
    gain over seeds is at least half the trainer-CLIP's and who shows a gain on every seed the
    effect has (`judged.survives`); none -> the issue's flag. 'no judge' where neither was
    evaluated; 'n/a' where the trainer's CLIP shows no gain to confirm (on some seed none)."""
    if not seen:
        return "no judge"
    ours = gain(metric, diffs.mean())
    if ours <= 0 or (gain(metric, diffs) <= 0).any():
        return "n/a (no gain under the trainer's CLIP on every seed)"
    kept = [judge_name(judge) for judge, judged in seen.items() if survives(
        ours, gain(judge, judged.mean()),
        all(gain(judge, judged.get(s, float("nan"))) > 0 for s in diffs.index))]
    if not kept:
        return FLAG
    if len(kept) == 2:
        return "survives both judges"
    if len(seen) == 1:
        return f"survives the {kept[0]} (the only judge evaluated)"
    return f"survives the {kept[0]} only"


def effects_table(
    summary: pd.DataFrame,
    versus: pd.DataFrame | None = None,
    effects: tuple[Effect, ...] = README_EFFECTS,
) -> pd.DataFrame:
    """`effects` (the README's: EFFECTS then UNMET), each judged over the summary's seeds."""
    rows = [judge(effect, summary, versus) for effect in effects]
    return pd.DataFrame(rows, columns=COLUMNS)


def load_summary(path: Path, configs: list[Path] | None) -> pd.DataFrame:
    """summary.csv, or the summary of a metrics folder's finished tables under `configs`
    (`summary.folder_summary`: the runs of a preset whose report was not made)."""
    if path.is_dir():
        from distinctcap.config.check import load_schema, validate
        from distinctcap.core.configfile import read_configs
        from distinctcap.report.summary import folder_summary

        if not configs:
            raise DistinctcapError(f"{path} is a metrics folder: give --configs, its config files")
        return folder_summary(path, validate(read_configs(configs), load_schema()))
    return pd.read_csv(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summary", type=Path,
                        help="results/metrics/summary.csv, or results/metrics with --configs")
    parser.add_argument("versus", type=Path, nargs="?", help="results/report/versus.csv")
    parser.add_argument("--scst", action="store_true",
                        help="the SCST effects (presets/scst.yaml) instead of the README's")
    parser.add_argument("--configs", type=Path, nargs="+",
                        help="with a metrics folder: the config files it was made with")
    args = parser.parse_args(argv)
    if not args.summary.exists():
        parser.error(f"{args.summary} does not exist: run the pipeline first (make seeds)")
    versus = pd.read_csv(args.versus) if args.versus and args.versus.exists() else None
    try:
        summary = load_summary(args.summary, args.configs)
    except DistinctcapError as error:
        parser.error(str(error))
    table = effects_table(summary, versus, SCST_EFFECTS if args.scst else README_EFFECTS)
    print(markdown_table(COLUMNS, table.astype(str).values.tolist()))


if __name__ == "__main__":
    main()
