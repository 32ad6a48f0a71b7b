"""The `distinctcap` command (also `python -m distinctcap`):

    distinctcap caption RUN_DIR IMAGE_OR_FOLDER... [--decoding beam3] [--out captions.jsonl]
                                                   [--html vis.html] [--clip PATH]
    distinctcap runs [--results DIR]           the trained runs with their headline metrics
    distinctcap compare [--results DIR]        the headline table (the README's 9 columns) and
                                               each method's verdict against the reference
                                               (DIR: default the newest results folder)
    distinctcap fetch [--configfile config.coco.yaml] [--offline]
                                               download what the config's jobs read (COCO, the
                                               CLIP tag, the captioner, SPICE's jars), or with
                                               --offline say what is missing
    distinctcap check-config FILE... [--syntax] the config files merged as --configfile merges
                                               them, checked; a YAML error names file and line
    distinctcap show-run NAME [--configfile FILE...]
                                               run NAME's effective settings (YAML) after
                                               config.yaml, each --configfile and the schema's
                                               defaults: what its training reads
    distinctcap evaluate RESULTS.json... --data results/data [--versus BASELINE.json]
                         [--out scores.csv] [--split test] [--configfile config.yaml]
                                               score any captioner's results file (COCO caption
                                               format, or caption --out's JSON lines) as the
                                               evaluate rule scores the pipeline's captions;
                                               bootstrap against --versus
    distinctcap plan [--adopt] [-- SNAKEMAKE_ARGS...]
                                               what `snakemake SNAKEMAKE_ARGS` here would redo,
                                               per rule and why (make plan EXP=... CONFIGS=...);
                                               --adopt: keep an older release's results

Light at import: torch loads only inside `caption`. SIGTERM and SIGINT stop a command with one
line, after each `with` on the way out has removed its temporary files (`Stopped`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from distinctcap.core.errors import DistinctcapError

WHAT_IT_DOES = (
    "distinctcap trains image captioners that say what is specific to each image (MLE, UNKT, "
    "contrastive, SMILE and specificity objectives, one Snakemake pipeline) and this command "
    "uses what the pipeline made: caption your own images with a trained run, list the runs "
    "and compare their metrics, fetch what a config needs, check a config."
)
# One example per subcommand, shown by `distinctcap --help` and by the subcommand's --help.
EXAMPLES = {
    "caption": "distinctcap caption results/runs/smile my_photos/ --html captions.html",
    "runs": "distinctcap runs --results results",
    "compare": "distinctcap compare --results results",
    "fetch": "distinctcap fetch --configfile config.coco.yaml --offline",
    "check-config": "distinctcap check-config config.yaml presets/quick.yaml",
    "show-run": "distinctcap show-run smile --configfile presets/quick.yaml",
    "evaluate": "distinctcap evaluate my_results.json --data experiments/quick/results/data",
    "plan": "distinctcap plan -- --directory experiments/quick --configfile presets/quick.yaml",
}


def examples_text(names=None) -> str:
    names = names or list(EXAMPLES)
    return "example" + ("s" if len(names) > 1 else "") + ":\n" + "\n".join(
        f"  {EXAMPLES[name]}" for name in names
    )


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="distinctcap",
        description=textwrap.fill(WHAT_IT_DOES, 88),
        epilog=examples_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = top.add_subparsers(dest="command", required=True)
    cap = commands.add_parser("caption", help="caption your own images with a trained run")
    cap.add_argument("run_dir", help="a run folder, e.g. results/runs/smile")
    cap.add_argument("images", nargs="+", help="image files and folders (searched recursively)")
    cap.add_argument("--decoding", default="greedy", help="a decoding setting of the run's config")
    cap.add_argument("--out", help="write one JSON line per image here")
    cap.add_argument("--html", help="write a page of images and captions here")
    cap.add_argument("--clip", help="the run's CLIP, if it moved (its checksum must match)")
    cap.add_argument("--device", default="auto", help="auto (GPU if usable), cpu or cuda")
    for name, text in (("runs", "list the trained runs"), ("compare", "the headline table")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--results", help="a results folder (default: the newest of results/ "
                         "and experiments/*/results)")
    fetch = commands.add_parser("fetch", help="download what a config's jobs will read")
    fetch.add_argument("--configfile", default="config.yaml", help="the run's config file")
    fetch.add_argument("--offline", action="store_true", help="download nothing, only check")
    check = commands.add_parser("check-config", help="check config files before snakemake")
    check.add_argument("files", nargs="+", help="config.yaml and presets, in --configfile order")
    check.add_argument("--syntax", action="store_true", help="check only that each is YAML")
    show = commands.add_parser("show-run", help="a run's settings after every merge and default")
    show.add_argument("name", help="a run of the config (or a seed's model, <run>_s<seed>)")
    show.add_argument("--configfile", nargs="+", default=[],
                      help="the overlays, in snakemake's --configfile order (config.yaml "
                      "here is read first)")  # fmt: skip
    evaluate_parser(commands)
    plan = commands.add_parser("plan", help="what a snakemake run would redo, and why")
    plan.add_argument("--adopt", action="store_true", help="when only the records' form "
                      "changed (older release): snakemake --touch, recompute nothing")  # fmt: skip
    plan.add_argument("snakemake_args", nargs="*", metavar="SNAKEMAKE_ARGS",
                      help="after --: what you pass snakemake (--directory, --configfile, "
                      "targets)")  # fmt: skip
    for name, sub in commands.choices.items():
        sub.epilog = examples_text([name]) if name in EXAMPLES else None
        sub.formatter_class = argparse.RawDescriptionHelpFormatter
    return top


def evaluate_parser(commands) -> None:
    ev = commands.add_parser(
        "evaluate", help="score a results file (COCO caption format) as the pipeline scores its own"
    )
    ev.add_argument("results", nargs="+", help='[{"image_id": 42, "caption": "..."}] JSON '
                    "files, or what distinctcap caption --out wrote")  # fmt: skip
    ev.add_argument("--data", required=True, help="an experiment's prepared data, results/data")
    ev.add_argument("--versus", help="a baseline results file: paired bootstrap against it")
    ev.add_argument("--out", help="write one row per results file here (summary.csv's columns)")
    ev.add_argument("--split", default="test", help="the split whose images were captioned")
    ev.add_argument("--configfile", default="config.yaml",
                    help="the experiment's config (its evaluate block and seed)")  # fmt: skip
    ev.add_argument("--features", help="its CLIP features index (default: beside --data)")
    ev.add_argument("--device", default="cpu", help="cpu or cuda, for CLIP")


def caption(args) -> int:
    from distinctcap.runs.caption import Run, confidence, image_files, write_html, write_jsonl

    show_progress()
    start = time.monotonic()
    run = Run(args.run_dir, clip=args.clip, device=args.device)
    if run.threshold is None:
        print(
            f"distinctcap: run {run.name} is not calibrated (its card predates the threshold "
            "that flags images far from the training images): no image is flagged; write the "
            "card again with `snakemake --forcerun run_card`",
            file=sys.stderr,
        )
    count = len(image_files(args.images))
    print(f"distinctcap: captioning {count} file{'s' * (count != 1)} with run {run.name} "
          f"({args.decoding}) on {run.device.type}", file=sys.stderr)  # fmt: skip
    results = run.caption(args.images, decoding=args.decoding)
    bad = [r for r in results if "error" in r]
    for r in results:
        if "error" not in r:
            print(f"{r['file']}\t{r['caption']}\t({confidence(r)})")
    outside = sum(bool(r.get("outside")) for r in results)
    if outside:
        print(
            f"distinctcap: {outside} image(s) are far from run {run.name}'s training images "
            "(above): their captions are guesses",
            file=sys.stderr,
        )
    for r in bad:
        print(f"distinctcap: {r['file']}: not captioned: {r['error']}", file=sys.stderr)
    if args.out:
        write_jsonl(results, args.out)
    if args.html:
        write_html(results, args.html, f"{run.name} ({run.card['method']}), {args.decoding}")
    print(f"distinctcap: captioned {len(results) - len(bad)} images in "
          f"{time.monotonic() - start:.1f} s, {len(bad)} failed"
          + (" (above: files that could not be read)" if bad else ""), file=sys.stderr)  # fmt: skip
    return 1 if bad else 0


def show_progress() -> None:
    """The package's progress lines (core.logs.progress: a bar on a terminal, else a line
    every PROGRESS_SECONDS) on stderr; its other loggers stay as they are."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("distinctcap: %(message)s"))
    logger = logging.getLogger("distinctcap.progress")
    logger.handlers = [handler]  # one, to this call's stderr: a second command adds no second
    logger.setLevel(logging.INFO)
    logger.propagate = False


def runs(args) -> int:
    from distinctcap.report.summary import run_table
    from distinctcap.runs.experiments import find_results

    results = find_results(args.results, need_summary=False)
    print(f"{results}:\n{run_table(results)}", end="")
    return 0


def compare(args) -> int:
    from distinctcap.report.verdicts import compare_text
    from distinctcap.runs.experiments import find_results

    results = find_results(args.results, need_summary=True)
    print(f"{results}:\n{compare_text(results)}", end="")
    return 0


def fetch(args) -> int:
    from distinctcap.config.check import load
    from distinctcap.core.schema import SCHEMA_PATH
    from distinctcap.runs.fetch import run_fetch

    if not Path(args.configfile).is_file():
        raise DistinctcapError(f"--configfile {args.configfile}: no such file")
    return run_fetch(load(args.configfile, SCHEMA_PATH), offline=args.offline)


def check_config(args) -> int:
    from distinctcap.config.check import load_schema, validate
    from distinctcap.core.configfile import config_sources, read_configs

    config = read_configs(args.files)
    if not args.syntax:
        validate(config, load_schema(), config_sources(args.files))
    print(f"distinctcap: {', '.join(args.files)}: {'valid YAML' if args.syntax else 'valid'}")
    return 0


def show_run(args) -> int:
    import yaml

    from distinctcap.config.check import load_schema, validate
    from distinctcap.config.rungraph import effective_run_config, seeded_runs
    from distinctcap.core.configfile import config_sources, read_configs

    files = [*(["config.yaml"] if Path("config.yaml").is_file() else []), *args.configfile]
    files = list(dict.fromkeys(files))  # config.yaml given again is read once, first
    schema = load_schema()
    config = validate(read_configs(files), schema, config_sources(files))
    config = {**config, "runs": seeded_runs(config)}
    run = effective_run_config(config, args.name, schema)
    print(f"# run {args.name}: {', '.join(files) or 'the schema defaults'}, merged, defaults "
          "filled (its training's settings; a rule param)")  # fmt: skip
    print(yaml.safe_dump(run, sort_keys=False, default_flow_style=False), end="")
    return 0


def evaluate(args) -> int:
    from distinctcap.config.check import load
    from distinctcap.core.schema import SCHEMA_PATH
    from distinctcap.core.settings import EvalSettings
    from distinctcap.report.summary import write_summary
    from distinctcap.report.versus import markdown
    from distinctcap.runs import resultsfile as rf

    if not Path(args.configfile).is_file():
        raise DistinctcapError(f"--configfile {args.configfile}: no such file")
    config = load(args.configfile, SCHEMA_PATH)
    settings = EvalSettings.from_config(config["evaluate"], seed=config["seed"], device=args.device)
    data = rf.DataFolder.open(args.data, args.features)
    files = [*args.results, *([args.versus] if args.versus else [])]
    if len({Path(f).stem for f in files}) < len(files):
        raise DistinctcapError("results files are named by their stems: give each its own name")
    scored = []
    for path in files:
        results = rf.read_results(path, data, args.split)
        for line in rf.problem_lines(results):
            print(f"distinctcap: {line}", file=sys.stderr)
        scored.append((results, rf.score(results, data, args.split, settings)))
    print(rf.headline([e for _, e in scored]), end="")
    for ours in scored[: len(args.results)] if args.versus else []:
        table = rf.versus(ours, scored[-1], data, args.split, config["seed"])
        print("\n" + markdown(table, scored[-1][0].name), end="")
    if args.out:
        write_summary(rf.summary_rows([e for _, e in scored]), args.out)
    return 1 if any(r.problems for r, _ in scored) else 0


def plan(args) -> int:
    from distinctcap.runs.plan import plan as planned

    for line in planned(".", args.snakemake_args, adopt=args.adopt):
        print(line)
    return 0


COMMANDS = {
    "caption": caption,
    "runs": runs,
    "compare": compare,
    "fetch": fetch,
    "check-config": check_config,
    "show-run": show_run,
    "evaluate": evaluate,
    "plan": plan,
}


class Stopped(BaseException):
    """SIGTERM or SIGINT, raised where the command is, so that each `with` on the way out
    removes its temporary files (`evaluate`'s generated table, the COCO tools' files) and
    stops its Java servers and workers; a BaseException, so no `except Exception` keeps it."""


@contextmanager
def stopped_by_signals() -> Iterator[None]:
    """SIGTERM and SIGINT raise `Stopped` in this process (a forked worker dies of them as by
    default); the handlers before are back after. Only the main thread may set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()

    def stop(signum, _frame):
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        raise Stopped(signum)

    before = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        with stopped_by_signals():
            return COMMANDS[args.command](args)
    except DistinctcapError as error:
        print(f"distinctcap: {error}", file=sys.stderr)
        return 2
    except Stopped as stop:
        name = signal.Signals(stop.args[0]).name
        print(f"distinctcap {args.command}: stopped by {name}; temporary files removed; run "
              "the same command again to finish it", file=sys.stderr)  # fmt: skip
        return 128 + stop.args[0]
    except KeyboardInterrupt:  # Ctrl-C before the handler is in place: one line, no traceback
        print(f"\ndistinctcap {args.command}: stopped by SIGINT; run the same command again "
              "to finish it", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
