"""Whether a gain under the trainer's CLIP survives the independent judges (issue 45).

A method tuned on the trainer's CLIP can raise R@1, mean rank or CLIPScore under that CLIP
alone. The judges re-measure the same quantity without it: the judge CLIP (a second CLIP no
training rule sees) and, on the shapes world, scene retrieval (the caption's parsed claims
ranked against every image's true scene graph); `summary.JUDGE_METRICS` pairs each judge
column with the trainer's CLIP column it re-measures. The issue's rule: "A method whose gain
under a judge is less than half its gain under the trainer's CLIP, or whose interval includes
0, is flagged in words: 'gain measured mainly by the CLIP it was tuned on'."

Light (pandas): the front page imports it while Snakemake parses the workflow.
"""

from __future__ import annotations

import pandas as pd

from distinctcap.evaluate.headline import FIELD_METRICS, HEADLINE_QUALITY
from distinctcap.report.summary import JUDGE_METRICS

FLAG = "gain measured mainly by the CLIP it was tuned on"
# the mean ranks and CIDErBtw
LOWER_BETTER = frozenset(
    column for _, column, _, arrow, *_ in (*HEADLINE_QUALITY, *JUDGE_METRICS, *FIELD_METRICS)
    if arrow == "↓"
)
JUDGE_NAMES = {column: header for header, column, *_ in JUDGE_METRICS}


def judges_of(metric: str) -> list[str]:
    """The judge columns that re-measure the trainer's CLIP column `metric` (none for CIDEr)."""
    return [column for _, column, _, _, trainer in JUDGE_METRICS if trainer == metric]


def gain(metric: str, difference: float) -> float:
    """A difference in its metric's better direction: a lower mean rank is a gain."""
    return -difference if metric in LOWER_BETTER else difference


def survives(trainer_gain: float, judge_gain: float, judge_shown: bool) -> bool:
    """The issue's rule: a judge confirms a trainer-CLIP gain when it shows the gain
    (`judge_shown`: its interval excludes 0, or it is positive on every seed) and its gain is
    at least half the trainer-CLIP's."""
    return bool(judge_shown) and judge_gain >= trainer_gain / 2


def _interval(row) -> str:
    return f"{row.difference:+.3f} [{row.ci_low:+.3f}, {row.ci_high:+.3f}]"


def judge_findings(rows: pd.DataFrame, names: dict[str, str]) -> tuple[list[str], list[str]]:
    """(confirmed, flagged) from one run's versus rows under one decoding: for each trainer
    CLIP metric whose verdict is better and each judge row beside it, 'R@1 +0.100: judge R@1
    +0.080 [+0.050, +0.110]', in `flagged` where the judge's gain is under half the trainer's
    or its interval includes 0 (`survives`)."""
    by_metric = rows.set_index("metric")
    confirmed, flagged = [], []
    for trainer in dict.fromkeys(t for *_, t in JUDGE_METRICS):
        if trainer not in by_metric.index or by_metric.loc[trainer].verdict != "better":
            continue
        ours = by_metric.loc[trainer]
        for judge in judges_of(trainer):
            if judge not in by_metric.index or by_metric.loc[judge].verdict == "undefined":
                continue
            theirs = by_metric.loc[judge]
            shown = theirs.ci_low > 0 or theirs.ci_high < 0
            said = (f"{names.get(trainer, trainer)} {ours.difference:+.3f}: "
                    f"{JUDGE_NAMES[judge]} {_interval(theirs)}")  # fmt: skip
            ok = survives(gain(trainer, ours.difference), gain(judge, theirs.difference), shown)
            (confirmed if ok else flagged).append(said)
    return confirmed, flagged


def judge_line(rows: pd.DataFrame, names: dict[str, str]) -> str:
    """What the judges say of one run's trainer-CLIP gains (versus rows under one decoding):
    the flag with the gains it is about, else 'the judges confirm ...', else '' (no gain under
    the trainer's CLIP that a judge measured)."""
    confirmed, flagged = judge_findings(rows, names)
    if flagged:
        return f"{FLAG} ({'; '.join(flagged)})"
    if confirmed:
        return f"the judges confirm its CLIP gains ({'; '.join(confirmed)})"
    return ""
