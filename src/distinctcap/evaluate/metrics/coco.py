"""COCO caption quality metrics (UNKT §4.1): BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE.

pycocoevalcap's own wrappers write temporary files into its package folder (tokenizer, SPICE)
and start one Java process per scorer object. Here one `CocoTools` session runs the same jars
with private temporary folders, so evaluations work from a read-only venv and in parallel:
the PTB tokenizer runs once per `tokenize` call, METEOR is one long-lived `-stdio` server per
session (started on first use), and SPICE runs once over a batch of (candidate, refs) pairs.
BLEU, ROUGE-L and CIDEr-D are pycocoevalcap's pure-Python scorers. SPICE runs only where
its Stanford CoreNLP 3.6.0 jars are already installed (they are not on the dev box, so the
SPICE run path is exercised only where they are).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer import ptbtokenizer

from distinctcap.core.errors import DistinctcapError
from distinctcap.evaluate.metrics.cider import CiderD
from distinctcap.evaluate.metrics.result import MetricResult

Captions = Mapping[Hashable, Sequence[str]]
Pair = tuple[str, Sequence[str]]  # (candidate, references)

# pycocoevalcap is a namespace package (no __init__.py): locate it through a module file.
_PKG = Path(ptbtokenizer.__file__).resolve().parents[1]
PTB_JAR = _PKG / "tokenizer" / "stanford-corenlp-3.4.1.jar"
METEOR_JAR = _PKG / "meteor" / "meteor-1.5.jar"
SPICE_JAR = _PKG / "spice" / "spice-1.0.jar"
# pycocoevalcap's spice/get_stanford_models.py downloads these two on first use; we only look.
SPICE_CORENLP_JARS = tuple(
    _PKG / "spice" / "lib" / f"stanford-corenlp-3.6.0{suffix}.jar" for suffix in ("", "-models")
)
QUALITY_METRICS = ("bleu1", "bleu2", "bleu3", "bleu4", "meteor", "rouge_l", "cider", "spice")
_PUNCT = frozenset(ptbtokenizer.PUNCTUATIONS)


JAVA_INSTALL = "install Java 17, e.g. `apt-get install openjdk-17-jre-headless`"


def java_executable() -> str:
    """Path of `java`; the COCO tools need a JRE (8 or newer)."""
    java = shutil.which("java")
    if java is None:
        raise DistinctcapError(
            f"the COCO caption metrics need `java` on PATH (a JRE 8 or newer); {JAVA_INSTALL}"
        )
    return java


def check_java() -> str:
    """Path of a `java` that starts (`java -version`), else a DistinctcapError saying how to
    install one; the workflow calls it before any job when the run evaluates captions."""
    java = java_executable()
    try:
        subprocess.run([java, "-version"], capture_output=True, check=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as error:
        raise DistinctcapError(
            f"`{java} -version` fails ({error}); the COCO caption metrics need a working "
            f"JRE 8 or newer: {JAVA_INSTALL}"
        ) from error
    return java


def spice_unavailable_reason() -> str | None:
    """Why SPICE cannot run here, or None. Never downloads anything."""
    missing = [p.name for p in SPICE_CORENLP_JARS if not p.is_file()]
    if missing:
        return (
            f"SPICE needs Stanford CoreNLP 3.6.0 ({', '.join(missing)}) in "
            f"{SPICE_JAR.parent / 'lib'}"
            "; pycocoevalcap downloads them on first use, which this setup does not do "
            "(run pycocoevalcap/spice/get_stanford_models.py once where the internet is reachable)"
        )
    if shutil.which("java") is None:
        return "SPICE needs `java` on PATH"
    return None


def _clean(text: str) -> str:
    """One line, single spaces: PTB and METEOR read one caption per line."""
    return " ".join(text.replace("|||", " ").split())


class _Meteor:
    """A METEOR 1.5 `-stdio` server (the protocol of pycocoevalcap's Meteor), stats cached."""

    def __init__(self, java: str, memory: str):
        self._stderr = tempfile.TemporaryFile()
        # pycocoevalcap's command; the serial GC halves the resident memory of the paraphrase
        # table load (~0.6 instead of ~1.2 GiB) without changing any score.
        cmd = [
            java,
            "-XX:+UseSerialGC",
            f"-Xmx{memory}",
            "-jar",
            str(METEOR_JAR),
            "-",
            "-",
            "-stdio",
            "-l",
            "en",
            "-norm",
        ]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr
        )
        self._stats: dict[tuple[str, tuple[str, ...]], str] = {}

    def _readline(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            self._stderr.seek(0)
            tail = self._stderr.read().decode(errors="replace")[-2000:]
            raise DistinctcapError(f"METEOR ({METEOR_JAR.name}) stopped: {tail}")
        return line.decode().strip()

    def _write(self, lines: Sequence[str]) -> None:
        self.proc.stdin.write("".join(line + "\n" for line in lines).encode())
        self.proc.stdin.flush()

    def stats(self, pairs: Sequence[Pair], chunk: int = 64) -> list[str]:
        """METEOR sufficient statistics per pair; chunks keep both pipes far below 64 KiB."""
        keys = [(_clean(h), tuple(_clean(r) for r in refs)) for h, refs in pairs]
        todo = list(dict.fromkeys(k for k in keys if k not in self._stats))
        for start in range(0, len(todo), chunk):
            part = todo[start : start + chunk]
            self._write([" ||| ".join(("SCORE", *refs, hyp)) for hyp, refs in part])
            for key in part:
                self._stats[key] = self._readline()
        return [self._stats[k] for k in keys]

    def score(self, pairs: Sequence[Pair]) -> tuple[float, list[float]]:
        """Corpus METEOR (from summed statistics) and the per-pair segment scores."""
        if not pairs:
            return math.nan, []
        self._write([" ||| ".join(("EVAL", *self.stats(pairs)))])
        per_item = [float(self._readline()) for _ in pairs]
        return float(self._readline()), per_item

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


class CocoTools:
    """One evaluation's Java tools; use as a context manager so METEOR is stopped.

    `launches` counts Java process starts per tool, so callers and tests can check that an
    evaluation starts each tool once, never once per image.
    """

    def __init__(self, spice: bool = True, meteor_memory: str = "2G", spice_memory: str = "8G"):
        self.meteor_memory, self.spice_memory = meteor_memory, spice_memory
        self.spice_skip_reason = "SPICE disabled by the caller" if not spice else None
        self.spice_skip_reason = self.spice_skip_reason or spice_unavailable_reason()
        self.launches: Counter[str] = Counter()
        self._meteor: _Meteor | None = None
        self._spice: dict[tuple[str, tuple[str, ...]], float] = {}

    @property
    def java(self) -> str:
        """The `java` executable, looked up when a tool first needs it."""
        return java_executable()

    def __enter__(self) -> CocoTools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._meteor is not None:
            self._meteor.close()
            self._meteor = None

    def tokenize(self, texts: Sequence[str]) -> list[str]:
        """PTB-tokenise, lower-case and drop punctuation tokens (pycocoevalcap PTBTokenizer)."""
        lines = [_clean(t) for t in texts]
        if not lines:
            return []
        with tempfile.TemporaryDirectory(prefix="distinctcap-ptb-") as tmp:
            path = Path(tmp) / "captions.txt"
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            cmd = [
                self.java,
                "-cp",
                str(PTB_JAR),
                "edu.stanford.nlp.process.PTBTokenizer",
                "-preserveLines",
                "-lowerCase",
                "-encoding",
                "utf-8",
                str(path),
            ]
            self.launches["ptb"] += 1
            proc = subprocess.run(cmd, capture_output=True, cwd=tmp)
        out = proc.stdout.decode("utf-8").split("\n")
        if proc.returncode != 0 or len(out) != len(lines) + 1:
            raise DistinctcapError(
                f"PTB tokenizer failed (exit {proc.returncode}, {len(out) - 1} lines for "
                f"{len(lines)} captions): {proc.stderr.decode(errors='replace')[-2000:]}"
            )
        return [" ".join(w for w in line.split() if w not in _PUNCT) for line in out[:-1]]

    def tokenize_groups(self, *groups: Captions) -> list[dict[Hashable, list[str]]]:
        """Tokenise several {id: captions} mappings with a single tokenizer launch."""
        flat = [c for group in groups for caps in group.values() for c in caps]
        tokens = iter(self.tokenize(flat))
        return [{k: [next(tokens) for _ in caps] for k, caps in g.items()} for g in groups]

    def meteor(self, pairs: Sequence[Pair]) -> tuple[float, list[float]]:
        """Corpus METEOR and per-pair scores over (candidate, references) pairs."""
        if self._meteor is None:
            self.launches["meteor"] += 1
            self._meteor = _Meteor(self.java, self.meteor_memory)
        return self._meteor.score(pairs)

    def spice(self, pairs: Sequence[Pair]) -> list[float] | None:
        """Per-pair SPICE F-scores (one Java run for the pairs not seen yet); None if skipped."""
        if self.spice_skip_reason is not None:
            return None
        keys = [(h, tuple(refs)) for h, refs in pairs]
        todo = list(dict.fromkeys(k for k in keys if k not in self._spice))
        if todo:
            self._spice.update(zip(todo, self._run_spice(todo), strict=True))
        return [self._spice[k] for k in keys]

    def _run_spice(self, pairs: Sequence[tuple[str, tuple[str, ...]]]) -> list[float]:
        items = [{"image_id": i, "test": h, "refs": list(r)} for i, (h, r) in enumerate(pairs)]
        with tempfile.TemporaryDirectory(prefix="distinctcap-spice-") as tmp:
            src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
            src.write_text(json.dumps(items))
            cmd = [
                self.java,
                f"-Xmx{self.spice_memory}",
                "-jar",
                str(SPICE_JAR),
                str(src),
                "-out",
                str(dst),
                "-subset",
                "-silent",
            ]
            self.launches["spice"] += 1
            proc = subprocess.run(cmd, capture_output=True, cwd=tmp, env=_spice_env())
            if proc.returncode != 0:
                raise DistinctcapError(
                    f"SPICE failed: {proc.stderr.decode(errors='replace')[-2000:]}"
                )
            results = json.loads(dst.read_text())
        f_by_id = {r["image_id"]: r["scores"]["All"]["f"] for r in results}
        return [math.nan if f_by_id[i] is None else float(f_by_id[i]) for i in range(len(pairs))]


def _spice_env() -> dict[str, str]:
    """SPICE's FST serialiser reflects into java.base, which Java >= 16 forbids unless opened
    ("InaccessibleObjectException ... does not opens java.lang"). JDK_JAVA_OPTIONS is read by
    the launcher of Java 9+ only, so Java 8 runs the jar unchanged."""
    packages = ("lang", "lang.reflect", "util", "util.concurrent", "math", "text", "net", "io")
    opens = " ".join(f"--add-opens=java.base/java.{p}=ALL-UNNAMED" for p in packages)
    current = os.environ.get("JDK_JAVA_OPTIONS", "")
    return {**os.environ, "JDK_JAVA_OPTIONS": f"{current} {opens}".strip()}


@contextmanager
def coco_session(tools: CocoTools | None) -> Iterator[CocoTools]:
    """`tools` itself, or a fresh session closed on exit."""
    if tools is not None:
        yield tools
        return
    with CocoTools() as fresh:
        yield fresh


def check_references(gts: Captions, ids: Sequence[Hashable]) -> None:
    missing = [i for i in ids if i not in gts]
    if missing:
        raise DistinctcapError(f"no reference captions for image ids {missing[:5]}")
    empty = [i for i in ids if not gts[i]]
    if empty:
        raise DistinctcapError(f"image ids {empty[:5]} have an empty reference list")


def quality_scores(
    gts: Captions, res: Captions, *, tokenized: bool = False, tools: CocoTools | None = None
) -> MetricResult:
    """COCO caption metrics of one caption per image (UNKT §4.1 "Quality metrics").

    `gts`: image id -> reference captions; `res`: image id -> [the one candidate caption],
    same ids. Texts are PTB-tokenised here (one tokenizer launch) unless `tokenized`. BLEU-n is
    corpus BLEU ("closest" reference length), METEOR the corpus score from summed statistics,
    ROUGE-L and CIDEr-D (pycocoevalcap `Cider`, idf from `gts`) means over images, SPICE the
    mean F-score, or NaN with a reason in `skipped` when its CoreNLP jars are absent.
    Returns bleu1..bleu4, meteor, rouge_l, cider, spice on pycocoevalcap's scale (papers print
    them x100).
    """
    ids = list(res)
    if set(ids) != set(gts):
        extra = sorted(set(ids) ^ set(gts), key=str)[:5]
        raise DistinctcapError(f"gts and res must have the same image ids; differing: {extra}")
    bad = [i for i in ids if len(res[i]) != 1]
    if bad:
        raise DistinctcapError(f"res must hold exactly one caption per image; ids {bad[:5]} do not")
    check_references(gts, ids)
    with coco_session(tools) as t:
        if not tokenized:
            gts, res = t.tokenize_groups({i: gts[i] for i in ids}, {i: res[i] for i in ids})
        gts = {i: list(gts[i]) for i in ids}
        res = {i: list(res[i]) for i in ids}
        out = MetricResult()
        bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
        out.values.update({f"bleu{k + 1}": float(b) for k, b in enumerate(bleu)})
        pairs = [(res[i][0], gts[i]) for i in ids]
        out.values["meteor"] = t.meteor(pairs)[0]
        out.values["rouge_l"] = float(Rouge().compute_score(gts, res)[0])
        out.values["cider"] = float(Cider().compute_score(gts, res)[0])
        spice = t.spice(pairs)
        if spice is None:
            out.skip("spice", t.spice_skip_reason)
        else:
            out.values["spice"] = float(np.mean(spice))
    return out


def per_item_scores(
    pairs: Sequence[Pair],
    documents: Sequence[Sequence[str]],
    metrics: Sequence[str],
    tools: CocoTools,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Each pair's sentence-level score for every metric: one scorer call per metric.

    Pairs are tokenised (candidate, references). CIDEr-D takes its idf from `documents` (the
    reference sets of the distinct images), so scoring many samples of one image at once gives
    the same number as scoring them one evaluation at a time. Returns ({metric: (P,)}, skipped).
    """
    unknown = set(metrics) - set(QUALITY_METRICS)
    if unknown:
        raise DistinctcapError(f"unknown metrics {sorted(unknown)}; allowed: {QUALITY_METRICS}")
    gts = {k: list(refs) for k, (_, refs) in enumerate(pairs)}
    res = {k: [hyp] for k, (hyp, _) in enumerate(pairs)}
    scores: dict[str, np.ndarray] = {}
    skipped: dict[str, str] = {}
    if any(m.startswith("bleu") for m in metrics):
        _, bleu = Bleu(4).compute_score(gts, res, verbose=0)
        scores.update({f"bleu{k + 1}": np.asarray(b, dtype=float) for k, b in enumerate(bleu)})
    if "meteor" in metrics:
        scores["meteor"] = np.asarray(tools.meteor(pairs)[1], dtype=float)
    if "rouge_l" in metrics:
        scores["rouge_l"] = np.asarray(Rouge().compute_score(gts, res)[1], dtype=float)
    if "cider" in metrics:
        cider = CiderD(documents)
        scores["cider"] = np.array([cider.score(h, refs) for h, refs in pairs])
    if "spice" in metrics:
        spice = tools.spice(pairs)
        if spice is None:
            skipped["spice"] = tools.spice_skip_reason
            scores["spice"] = np.full(len(pairs), math.nan)
        else:
            scores["spice"] = np.asarray(spice, dtype=float)
    return {m: scores[m] for m in metrics}, skipped
