"""The docs table "COCO's shape on a CPU" (docs/performance.md) from `bench/rehearsal.py
--small-models` JSON files at several sizes, never by hand: per stage its wall and CPU seconds,
peak RSS and MB written at each size (each job's `usage:` log line, distinctcap.core.usage),
the growth from the smallest size to the largest, and the issue-55 goals checked on it.

    PYTHONPATH=src python bench/scale_table.py r10000/rehearsal.json r40000/rehearsal.json \
        r123287/rehearsal.json [--write docs/performance.md]

Stages are jobs grouped by their log: one row per upstream job, and one per per-run rule
(train, run_card, decode, evaluate) with the largest peak RSS of its jobs and the sums of their
seconds and bytes. Goals (issue 55): train, decode, evaluate, summary and report keep their peak
RSS within 1.25x of the smallest size's; the data, feature and entropy stages grow no faster than
linearly (CPU seconds at most 1.1x the image ratio) with their RSS bounded by a chunk (within
1.25x); the disk used is within 10 % of preflight's estimate. With --write the tables replace
what lies between the --block's markers in the file; else they are printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coco_table import write_between_markers  # noqa: E402  (bench/ is scripts, not a package)

from distinctcap.data.synthcoco import kept_by_part  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs"
# the rehearsals each docs block renders (tests/test_rehearsal.py holds them equal): the growth
# table (10,000 and 40,000 images of one pair of sessions, each stage on one commit at both
# sizes, and the first 123,287-image run, whose stages ran on several commits and sessions);
# that pair alone; the first full-size run alone; and the 10,000 run it was first set against
# (three commits)
SCALE = DOCS / "rehearsal/scale"
DOCS_BLOCKS = {
    "scale-table": [
        SCALE / "pair-10000.json",
        SCALE / "pair-40000.json",
        SCALE / "second-full-123287.json",
    ],
    "scale-same-session": [SCALE / "pair-10000.json", SCALE / "pair-40000.json"],
    "scale-full": [SCALE / "first-full-123287.json"],
    "scale-10k-123k": [SCALE / "full-10000.json", SCALE / "first-full-123287.json"],
}


def markers(block: str) -> tuple[str, str]:
    """The docs markers around a block's tables."""
    return f"<!-- {block}:begin -->", f"<!-- {block}:end -->"


RSS_GOAL = 1.25
RESUMED_MARK = "†"
RESUMED_NOTE = (
    f"{RESUMED_MARK} resumed: the job's last run reused a killed run's work (feature shards, "
    "an extracted archive), so its numbers are that run's, not the stage's whole cost."
)
LINEAR_SLACK = 1.1  # time may grow 10 % faster than the work: 13.5x from 10k to 123k
# What the work grows with, and its power: most stages touch each image a fixed number of
# times; the retrieval entropy scores every training caption over every training image (UNKT
# eq. 3) and the neighbours rank every training image against every other (specificity §3.2).
# The rehearsal keeps COCO's 5,000 val and test images at every size, so the train images grow
# faster than the images (x23.7 against x12.3 from 10,000 to 123,287).
GROWTH = {"linear": ("images", 1), "quadratic": ("train images", 2)}
PER_RUN = {"train": "train", "decode": "decode", "evaluate": "evaluate"}
UPSTREAM = {  # log -> (stage, goal)
    "preflight": ("preflight", None),
    "data/prepare_data": ("prepare_data", "linear"),
    "features/extract_features": ("extract_features", "linear"),
    "judge/judge_features": ("judge_features", "linear"),
    "entropy/retrieval_entropy": ("retrieval_entropy", "quadratic"),
    "entropy/split_entropy": ("split_entropy", "linear"),
    "entropy/entropy_report": ("entropy_report", "linear"),
    "evaluate/summarize": ("summarize", "rss"),
    "evaluate/versus_reference": ("versus_reference", "rss"),
    "evaluate/report_tables": ("report_tables", "rss"),
    "evaluate/report_plots": ("report_plots", "rss"),
    "evaluate/report_gallery": ("report_gallery", "rss"),
    "report_times": ("report_times", "rss"),
}
ORDER = [
    "preflight",
    "prepare_data",
    "extract_features",
    "judge_features",
    "retrieval_entropy",
    "split_entropy",
    "entropy_report",
    "neighbours",
    "train",
    "run_card",
    "decode",
    "evaluate",
    "summarize",
    "versus_reference",
    "report_tables",
    "report_plots",
    "report_gallery",
    "report_times",
]
GOALS = {**{s: g for s, g in UPSTREAM.values()}, "neighbours": "quadratic", "run_card": "rss"}
GOALS.update(dict.fromkeys(PER_RUN.values(), "rss"))


def stage_of(log: str) -> str | None:
    """The table's stage of a job log (its path under logs/, without .log)."""
    if log in UPSTREAM:
        return UPSTREAM[log][0]
    folder, _, name = log.partition("/")
    if folder == "neighbours":
        return "neighbours"
    if folder == "train":
        return "run_card" if name.endswith("-card") else "train"
    return PER_RUN.get(folder) if folder in ("decode", "evaluate") else None


def stages(result: dict) -> dict[str, dict]:
    """Per stage: jobs, wall_s, cpu_s and written_mb summed over its jobs, peak_rss_mb the
    largest of each job's own and its children's peak, resumed whether a job's last run reused
    a killed run's work (bench/rehearsal.py `resumed`)."""
    out: dict[str, dict] = {}
    for job in result["usage"]:
        name = stage_of(job["log"])
        if name is None:
            continue
        row = out.setdefault(
            name, {"jobs": 0, "wall_s": 0.0, "cpu_s": 0.0, "written_mb": 0.0, "peak_rss_mb": 0.0,
                   "resumed": False},
        )  # fmt: skip
        row["jobs"] += 1
        row["resumed"] |= bool(job.get("resumed"))
        for key in ("wall_s", "cpu_s"):
            row[key] += job[key]
        row["written_mb"] += job["written_mb"] or 0.0
        peak = max(job["peak_rss_mb"], job["children_peak_rss_mb"])
        row["peak_rss_mb"] = max(row["peak_rss_mb"], peak)
    return out


def work_sizes(result: dict) -> dict[str, int]:
    """What the stages' work grows with at a rehearsal's size (GROWTH): the images it generated
    and the train images the data stage kept (synthcoco.kept_by_part, held equal to the kept
    images the run counted)."""
    kept = kept_by_part(result["images"], cocos_val=True)
    counted = result.get("kept_images")
    if counted is not None and counted != sum(kept.values()):
        raise ValueError(
            f"the {result['images']:,}-image rehearsal kept {counted:,} images, not the "
            f"{sum(kept.values()):,} its synthetic COCO's layout keeps"
        )
    return {"images": result["images"], "train images": kept["train2017"]}


def verdict(goal: str | None, small: dict, large: dict, ratios: dict[str, float]) -> str:
    """The goal and whether the largest size meets it against the smallest, `ratios` holding
    the growth of each GROWTH unit (none where a size was resumed: its numbers are not the
    stage's whole cost)."""
    if small["resumed"] or large["resumed"]:
        return f"resumed{RESUMED_MARK}: not judged"
    rss = large["peak_rss_mb"] / small["peak_rss_mb"]
    if goal == "rss":
        return f"RSS x{rss:.2f} {'met' if rss <= RSS_GOAL else 'MISSED'}"
    if goal in GROWTH:
        unit, power = GROWTH[goal]
        cpu = large["cpu_s"] / small["cpu_s"]
        work = ratios[unit] ** power
        met = cpu <= LINEAR_SLACK * work and rss <= RSS_GOAL
        return (
            f"CPU x{cpu:.1f} of {unit}{'²' if power == 2 else ''} x{work:.1f}, RSS x{rss:.2f} "
            + ("met" if met else "MISSED")
        )
    return "-"


def cell(rows: list[dict | None], key: str, fmt: str) -> str:
    return " / ".join(
        "-" if r is None else format(r[key], fmt) + (RESUMED_MARK if r["resumed"] else "")
        for r in rows
    )


def growths(results: list[dict]) -> list[dict[str, float]]:
    """Each larger size's growth of every GROWTH unit against the smallest size."""
    sizes = [work_sizes(r) for r in results]
    return [{unit: size[unit] / sizes[0][unit] for unit in size} for size in sizes[1:]]


def goal_cells(name: str, rows: list[dict | None], ratios: list[dict[str, float]]) -> list[str]:
    """The stage's goal judged at each larger size against the smallest (`growths`)."""
    if len(rows) == 1:
        return ["one size"]
    return [
        verdict(GOALS.get(name), rows[0], row, growth)
        if rows[0] is not None and row is not None
        else "not run at both"
        for row, growth in zip(rows[1:], ratios, strict=True)
    ]


def stage_table(results: list[dict]) -> str:
    """Markdown: one row per stage, each measure at every size (smallest first), and its goal
    judged at each larger size against the smallest."""
    per_size = [stages(r) for r in results]
    sizes = " / ".join(f"{r['images']:,}" for r in results)
    ratios = growths(results)
    first = f"{results[0]['images']:,}"
    goals = [f"goal, {r['images']:,} against {first}" for r in results[1:]] or ["goal"]
    lines = [
        f"| stage (jobs) | wall s ({sizes}) | CPU s | peak RSS MB | written MB | "
        + " | ".join(goals)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(goals),
    ]
    for name in ORDER:
        rows = [s.get(name) for s in per_size]
        if all(r is None for r in rows):
            continue
        jobs = max(r["jobs"] for r in rows if r)
        lines.append(
            f"| {name} ({jobs}) | {cell(rows, 'wall_s', ',.0f')} | {cell(rows, 'cpu_s', ',.0f')} "
            f"| {cell(rows, 'peak_rss_mb', ',.0f')} | {cell(rows, 'written_mb', ',.0f')} | "
            + " | ".join(goal_cells(name, rows, ratios))
            + " |"
        )
    if any(row["resumed"] for size in per_size for row in size.values()):
        lines += ["", RESUMED_NOTE]
    return "\n".join(lines) + "\n"


def with_total(parts: list[dict]) -> list[dict]:
    total = {"part": "total", "bytes": sum(p["bytes"] for p in parts)}
    total["used_bytes"] = sum(p["used_bytes"] or 0 for p in parts)
    return [*parts, total]


def disk_table(results: list[dict]) -> str:
    """Markdown: preflight's estimate of each part as rule preflight makes it (its image count
    inferred from the archives' bytes) and at the images the data stage kept, beside what was on
    disk after the run, per size; a run of some targets only is left out (its disk is not the
    whole DAG's)."""
    lines = [
        "| size | part | preflight's estimate | estimate at the images kept | on disk "
        "| on disk / estimate at the images kept |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.get("targets"):
            lines.append(f"| {r['images']:,} | - | run for some targets only: not compared | | | |")
            continue
        at_kept = {p["part"]: p for p in with_total(r["disk_at_kept_images"])}
        for p in with_total(r["disk"]):
            kept, used = at_kept[p["part"]]["bytes"], p["used_bytes"]
            share = f"{used / kept:.2f}" if used is not None and kept else "-"
            lines.append(
                f"| {r['images']:,} | {p['part']} | {p['bytes'] / 1e9:.2f} GB | "
                f"{kept / 1e9:.2f} GB | {'-' if used is None else f'{used / 1e9:.2f} GB'} "
                f"| {share} |"
            )
    return "\n".join(lines) + "\n"


def data_table(results: list[dict]) -> str:
    """Markdown: the odd files synthcoco wrote and what the data stage did with them."""
    lines = ["| size | odd files written | quarantined (reason: count) | decoded kinds |"]
    lines.append("|---|---|---|---|")
    for r in results:
        written = ", ".join(f"{k} {v:,}" for k, v in r["data"]["odd_files_written"].items())
        counts = r["data"]["counts"] or {}
        skipped = "; ".join(f"{k}: {v:,}" for k, v in counts.get("skipped_by_reason", {}).items())
        kinds = ", ".join(f"{k} {v:,}" for k, v in counts.get("checked_image_kinds", {}).items())
        lines.append(f"| {r['images']:,} | {written} | {skipped or 'none'} | {kinds or '-'} |")
    return "\n".join(lines) + "\n"


def machine_line(results: list[dict]) -> str:
    r = results[-1]
    return (
        f"Measured on {r['machine']} ({r['card']}), `bench/rehearsal.py --small-models`, "
        f"{r['steps']} steps per run; snakemake rc "
        + ", ".join(f"{x['images']:,}: {x['snakemake_rc']}" for x in results)
        + ".\n"
    )


def tables(results: list[dict]) -> str:
    results = sorted(results, key=lambda r: r["images"])
    return "\n".join(
        [machine_line(results), stage_table(results), disk_table(results), data_table(results)]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="rehearsal.json files")
    parser.add_argument("--write", type=Path, help="the Markdown file with the markers")
    parser.add_argument("--block", default="scale-table", help="whose markers (DOCS_BLOCKS)")
    args = parser.parse_args()
    text = tables([json.loads(p.read_text()) for p in args.inputs])
    if args.write:
        write_between_markers(args.write, text, *markers(args.block))
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
