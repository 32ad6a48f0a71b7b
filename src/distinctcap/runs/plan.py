"""`distinctcap plan [-- SNAKEMAKE_ARGS]`: what `snakemake SNAKEMAKE_ARGS` would redo, per rule
and why, in words (issue 47): "7 trainings: train.lr changed in runs cl, smile".

It asks Snakemake itself (`snakemake -n`, the same decision a real run makes), groups the
planned jobs by rule and reason, and for a params change compares the values Snakemake prints
(before and now) key by key. A job planned only because a job before it reruns is counted
under that reason ("after a rerun of train_run"). Imports no torch.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from distinctcap.config.check import load_schema
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.params import Defaults, canonical_params

NOUNS = {
    "train_run": "trainings",
    "decode": "decodes",
    "evaluate": "evaluations",
    "evaluate_gpu": "GPU evaluations",
    "run_card": "run cards",
}
PARAMS = "Params have changed since last execution: Union of exclusive params before and now "
PARAMS += "across all output: "


@dataclass
class Job:
    rule: str
    wildcards: dict = field(default_factory=dict)
    reason: str = ""
    output: list = field(default_factory=list)

    @property
    def label(self) -> str:
        if list(self.wildcards) == ["run"]:
            return self.wildcards["run"]
        return ",".join(f"{k}={v}" for k, v in self.wildcards.items())


def dry_run(directory: Path, args: list[str], snakemake: str | None = None) -> str:
    """The output of `snakemake -n ARGS` in `directory` (`args`: what the user passes snakemake:
    --directory, --configfile, targets)."""
    return snakemake_run(directory, ["-n", "--nolock", *args], snakemake)


def snakemake_run(directory: Path, args: list[str], snakemake: str | None = None) -> str:
    """The output of `snakemake --cores 1 ARGS` in `directory`; one line if it fails."""
    snakemake = snakemake or str(Path(sys.executable).with_name("snakemake"))
    command = [snakemake, "--cores", "1", *args]
    try:
        done = subprocess.run(command, cwd=directory, capture_output=True, text=True)
    except FileNotFoundError as error:
        raise DistinctcapError(f"cannot run snakemake ({snakemake}): {error.strerror}") from None
    out = done.stdout + done.stderr
    if done.returncode != 0:
        last = [line for line in out.splitlines() if line.strip()][-1:] or ["no output"]
        what = " ".join(a for a in args if a in ("-n", "--touch"))
        raise DistinctcapError(f"snakemake {what} failed in {directory}: {last[0].strip()}")
    return out


def parse_jobs(text: str) -> list[Job]:
    """The planned jobs of a `snakemake -n` output (its `rule NAME:` blocks)."""
    jobs, job = [], None
    for line in text.splitlines():
        head = re.match(r"^(?:local)?rule (\S+):$", line)
        if head:
            job = Job(head.group(1))
            jobs.append(job)
        elif job and line.startswith("    ") and ": " in line:
            key, value = line.strip().split(": ", 1)
            if key == "wildcards":
                job.wildcards = dict(p.split("=", 1) for p in value.split(", ") if "=" in p)
            elif key == "reason":
                job.reason = value
            elif key == "output":
                job.output = value.split(", ")
        elif not line.startswith(" "):
            job = None
    return [j for j in jobs if j.rule != "all"]


def _literals(text: str) -> list:
    """The Python literals of Snakemake's comma-joined reprs (a split at a comma inside one is
    never itself a literal, so the shortest parsing prefix is one value)."""
    values, piece = [], ""
    for part in text.split(","):
        piece = f"{piece},{part}" if piece else part
        try:
            values.append(ast.literal_eval(piece.strip()))
            piece = ""
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
    return values


def params_change(reason: str) -> tuple[list, list] | None:
    """(values before, values now) of a params-changed reason, else None."""
    if PARAMS not in reason:
        return None
    text = reason.split(PARAMS, 1)[1].split("; ")[0].strip()
    before, _, now = text.partition(" now: ")
    before = before.removeprefix("before: ")

    def values(part: str) -> list:
        return [] if part.strip() == "<nothing exclusive>" else _literals(part)

    return values(before), values(now)


def flat(value: object, prefix: str = "") -> dict:
    """{dotted key: leaf value} of nested dicts; an empty dict has no leaves (a section whose
    keys are all at their defaults is the same as none)."""
    if isinstance(value, dict):
        out = {}
        for key, sub in value.items():
            out |= flat(sub, f"{prefix}.{key}" if prefix else str(key))
        return out
    return {prefix: value}


# the config section whose defaults a rule's recorded settings dict is compared against, for
# the rules that record one section (common.smk); runs, decodings and run configs are known by
# their shape
SECTIONS = {
    "prepare_data": ("data",),
    "train_clip": ("clip", "train"),
    "extract_features": ("clip", "features"),
    "extract_captioner_features": ("clip", "features"),
    "evaluate": ("evaluate",),
    "evaluate_gpu": ("evaluate",),
}


def canonical(value: object, rule: str, defaults: Defaults) -> object:
    """`value`, a recorded param of `rule`, in the canonical form this release records, so
    that a record of an older release (the full settings) compares by its settings alone."""
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[2], dict):
        split, name, setting = value  # a decode job's (split, decoding, setting)
        return (split, name, canonical_params(setting, defaults.decoding(setting)))
    if isinstance(value, list):
        return [canonical(v, rule, defaults) for v in value]
    if not isinstance(value, dict) or not value:
        return value
    if "method" in value and "train" in value:  # a run's effective config
        return canonical_params(value, defaults.effective_run(value))
    if all(isinstance(v, dict) and "method" in v for v in value.values()):
        return defaults.runs(value)
    if all(isinstance(v, dict) and "kind" in v for v in value.values()):
        return defaults.decodings(value)
    if rule in SECTIONS:
        return canonical_params(value, defaults.section(*SECTIONS[rule]))
    return value


def _same(new: object, old: object) -> bool:
    """The same values in the same order (a section at its defaults is the same as none)."""
    if isinstance(new, dict) and isinstance(old, dict):
        return list(flat(new).items()) == list(flat(old).items())
    return repr(new) == repr(old)


def changed_keys(before: list, now: list, rule: str = "", defaults: Defaults | None = None):
    """The dotted keys that differ between a job's changed params, each old value paired with
    the new one most like it; [] when the two differ only in form (a record of an older
    release whose settings are the same)."""
    if defaults is not None:
        before = [canonical(v, rule, defaults) for v in before]
        now = [canonical(v, rule, defaults) for v in now]
    now = list(now)
    keys = set()
    for old in before:
        same = [k for k, v in enumerate(now) if _same(v, old)]
        if same:  # the same value in the form this release records
            del now[same[0]]
            continue
        if not isinstance(old, dict):
            keys.add("other settings")
            continue
        new = max(
            (v for v in now if isinstance(v, dict)),
            key=lambda v: sum(flat(old).get(k, ...) == x for k, x in flat(v).items()),
            default=None,
        )
        if new is None:
            keys.add("other settings")
            continue
        now.remove(new)
        fa, fb = flat(old), flat(new)
        differ = {k for k in fa.keys() | fb.keys() if fa.get(k, ...) != fb.get(k, ...)}
        keys |= differ or {"the order of runs or settings"}  # equal but for their order
    if now:
        keys.add("other settings")
    return sorted(keys)


OLDER_FORM = "settings unchanged, recorded by an older release"
# reasons that recompute nothing a result depends on: the records' form, a rerun they cause,
# an output a release added (`snakemake --touch` then `snakemake` keeps every result)
NO_CHANGE = (OLDER_FORM, "outputs missing", "after a rerun")


def _reason_parts(reason: str) -> list[str]:
    """Snakemake's reasons of one job ("A: x; B: y"), a params change kept whole."""
    if PARAMS in reason:
        head, _, tail = reason.partition(PARAMS)
        return [*_reason_parts(head.rstrip("; ")), PARAMS + tail] if head else [PARAMS + tail]
    return [part for part in reason.split("; ") if part.strip()]


def why(job: Job, defaults: Defaults | None = None, producers: dict | None = None) -> str:
    """The reasons of `job` in words, the same for every job the same change reruns. A job
    planned only because jobs before it rerun names the jobs that start it ("after a rerun of
    prepare_data"); `producers`: planned output file -> its job."""
    own, roots = _own_reasons(job, defaults), set()
    if not own:
        roots = _roots(job, defaults, producers or {}, set())
    after = [f"after a rerun of {', '.join(sorted(roots))}"] if roots else []
    return " and ".join(dict.fromkeys(own + after)) or "after a rerun"


def _updated(job: Job) -> list[str]:
    """The files of `job` that a job before it rewrites (Snakemake's reason)."""
    for part in _reason_parts(job.reason):
        if part.startswith("Input files updated by another job"):
            return [f.strip() for f in part.split(": ", 1)[-1].split(", ")]
    return []


def _own_reasons(job: Job, defaults: Defaults | None) -> list[str]:
    """`job`'s reasons in words, but the reruns before it."""
    words = []
    for part in _reason_parts(job.reason):
        change = params_change(part)
        if change is not None:
            keys = changed_keys(*change, rule=job.rule, defaults=defaults)
            words.append(", ".join(keys) + " changed" if keys else OLDER_FORM)
        elif not part.startswith("Input files updated by another job"):
            words.append(_plain(part))
    return words


def _roots(job: Job, defaults, producers: dict, seen: set) -> set[str]:
    """The rules of the jobs with reasons of their own that `job` is planned after."""
    roots = set()
    for path in _updated(job):
        before = producers.get(path)
        if before is None or id(before) in seen:
            continue
        seen.add(id(before))
        if _own_reasons(before, defaults):
            roots.add(before.rule)
        else:
            roots |= _roots(before, defaults, producers, seen)
    return roots


def _plain(part: str) -> str:
    for start, text in (
        ("Missing output files", "outputs missing"),
        ("Forced execution", "forced"),
        ("Updated input files", "an input file is newer"),
        ("Set of input files has changed", "its set of input files changed"),
        ("Code has changed", "its script changed"),
        ("Software environment", "its software environment changed"),
    ):
        if part.startswith(start):
            return text
    if "metadata" in part.lower():
        return "no record of a previous run (metadata)"
    return part.split(":")[0].lower()


def describe(jobs: list[Job], defaults: Defaults | None = None) -> list[str]:
    """One line per rule: how many jobs and why, naming the runs (or wildcards) of each; a
    last line when no job recomputes a result (only the records' form changed)."""
    producers = {f: job for job in jobs for f in job.output}
    by_rule: dict[str, list[Job]] = defaultdict(list)
    for job in jobs:
        by_rule[job.rule].append(job)
    lines = []
    for rule, rule_jobs in by_rule.items():
        reasons: dict[str, list[str]] = defaultdict(list)
        for job in rule_jobs:
            reasons[why(job, defaults, producers)].append(job.label)
        parts = []
        for text, labels in reasons.items():
            named = [label for label in labels if label]
            if named:
                if "run" in rule_jobs[0].wildcards:
                    text += f" in run{'s' if len(named) > 1 else ''} {', '.join(named)}"
                else:
                    text += f" ({', '.join(named)})"
            parts.append(text)
        count = len(rule_jobs)
        noun = NOUNS.get(rule, f"{rule} jobs")
        if count == 1:
            noun = noun.removesuffix("s") if rule in NOUNS else f"{rule} job"
        lines.append(f"{count} {noun}: {'; '.join(parts)}")
    if only_form(jobs, defaults):
        lines.append(
            "no setting changed, only the form of the records: `distinctcap plan --adopt` "
            "(snakemake --touch) records them as they are, then `snakemake` makes what is missing"
        )
    return lines


def only_form(jobs: list[Job], defaults: Defaults | None) -> bool:
    """Whether `jobs` rerun for no change of a setting or input: some only because of the
    form of their records (an older release), the others after them or for new outputs."""
    producers = {f: job for job in jobs for f in job.output}
    texts = [part for job in jobs for part in why(job, defaults, producers).split(" and ")]
    return any(t == OLDER_FORM for t in texts) and all(t.startswith(NO_CHANGE) for t in texts)


def plan(
    directory: str | Path = ".", args=(), snakemake: str | None = None, adopt: bool = False
) -> list[str]:
    """The lines `distinctcap plan` prints for `snakemake ARGS` run in `directory`. `adopt`:
    when only the records' form changed (`only_form`), `snakemake --touch ARGS` first, so that
    Snakemake records them as this release does and recomputes nothing, then the plan after."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DistinctcapError(f"{directory}: no such folder")
    defaults = Defaults(load_schema())
    jobs = parse_jobs(dry_run(directory, list(args), snakemake))
    if adopt and jobs:
        if not only_form(jobs, defaults):
            raise DistinctcapError(
                "--adopt: a setting or input changed (distinctcap plan says which); nothing "
                "was touched"
            )
        snakemake_run(directory, ["--touch", *args], snakemake)
        jobs = parse_jobs(dry_run(directory, list(args), snakemake))
    return describe(jobs, defaults) or ["nothing to redo"]
