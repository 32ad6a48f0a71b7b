"""COCO caption quality metrics (UNKT §4.1): BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE.

pycocoevalcap's own wrappers write temporary files into its package folder (tokenizer, SPICE)
and start one Java process per scorer object. Here one `CocoTools` session runs the same jars
with private temporary folders, so evaluations work from a read-only venv and in parallel:
the PTB tokenizer runs once per `tokenize` call (over `workers` JVMs side by side for a long
list), METEOR is one long-lived `-stdio` server per session (started on first use; per-pair
scores of many pairs go over `workers` servers), and SPICE runs once over a batch of
(candidate, refs) pairs with `-threads` and a `-cache`. A session is one evaluate job: it
tokenises a reference set once (and, with a `cache_dir`, once for every later job and run:
the tokens are stored by content hash) and builds CIDEr-D's document frequencies of a
corpus once (`cider_d`).
BLEU, ROUGE-L and CIDEr-D are pycocoevalcap's pure-Python scorers. SPICE runs only where
its Stanford CoreNLP 3.6.0 jars are already installed (they are not on the dev box, so the
SPICE run path is exercised only where they are).
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import math
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Collection, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.bleu.bleu_scorer import BleuScorer, cook_refs, cook_test
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer import ptbtokenizer

from distinctcap.core import work
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path
from distinctcap.evaluate.metrics.parallel import (
    CHUNKS_PER_WORKER,
    chunk_bounds,
    fork_map_beside,
)
from distinctcap.scores.cider import CiderD
from distinctcap.scores.result import MetricResult

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
ROUGE_BETA = 1.2  # pycocoevalcap Rouge's beta
QUALITY_METRICS = ("bleu1", "bleu2", "bleu3", "bleu4", "meteor", "rouge_l", "cider", "spice")
_PUNCT = frozenset(ptbtokenizer.PUNCTUATIONS)
# A tokenizer JVM per this many captions at most (its start is ~1 CPU s), up to `workers`.
PTB_LINES_PER_JVM = 20_000
# A METEOR server per this many pairs at most, up to half the job's `workers` (the forked
# Python scorers use the other half): a server's start (its paraphrase table) is ~15 CPU s,
# a pair with 5 references ~1.1-2.3 CPU ms.
METEOR_PAIRS_PER_SERVER = 10_000
# The tokenizer's JVMs run with the client compiler only: a launch lives seconds, too short
# for C2's optimising compiles to repay their CPU. METEOR's servers keep Java's default
# tiered compiler: C2 loads the paraphrase table in ~13 instead of ~19 s and scores faster
# from a few hundred pairs on (docs/performance.md). Scores are the same either way (Java's
# floating point is strict since 17).
PTB_JIT_OPTIONS = ("-XX:TieredStopAtLevel=1",)
# The serial GC halves the resident memory of the paraphrase table load (~0.6 instead of
# ~1.1 GiB) without changing any score.
METEOR_JVM_OPTIONS = ("-XX:+UseSerialGC",)
MAX_METEOR_SERVERS = 4  # ~1 GB resident each (the evaluate rule's mem_mb counts on it)


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


def _pair_key(pair: Pair) -> tuple[str, tuple[str, ...]]:
    """A (candidate, references) pair as METEOR reads it: one key per distinct pair."""
    hypothesis, references = pair
    return _clean(hypothesis), tuple(_clean(r) for r in references)


class _Meteor:
    """A METEOR 1.5 `-stdio` server (the protocol of pycocoevalcap's Meteor), stats cached."""

    def __init__(self, java: str, memory: str, jvm_options: Sequence[str] = METEOR_JVM_OPTIONS):
        self._stderr = tempfile.TemporaryFile()
        cmd = [  # pycocoevalcap's command
            java,
            *jvm_options,
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
        keys = [_pair_key(pair) for pair in pairs]
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
    """One evaluate job's Java tools and shared work; use as a context manager so METEOR
    is stopped.

    `workers`: the job's cores, for the tokenizer's and METEOR's JVMs and the forked n-gram
    metrics (distinctcap.evaluate.metrics.parallel). `cache_dir`: where reference sets'
    tokens are kept by content hash for later jobs (the experiment's results folder), or
    None. `launches` counts Java process starts per tool, so callers and tests can check
    that an evaluation starts each tool once (or once per worker), never once per image.
    """

    def __init__(
        self,
        spice: bool = True,
        meteor_memory: str = "2G",
        spice_memory: str = "8G",
        workers: int = 1,
        cache_dir: str | Path | None = None,
    ):
        self.meteor_memory, self.spice_memory = meteor_memory, spice_memory
        self.workers = max(1, int(workers))
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self.spice_skip_reason = "SPICE disabled by the caller" if not spice else None
        self.spice_skip_reason = self.spice_skip_reason or spice_unavailable_reason()
        self.launches: Counter[str] = Counter()
        self._meteors: list[_Meteor] = []
        self._spice: dict[tuple[str, tuple[str, ...]], float] = {}
        self._tokens: dict[str, list[str]] = {}  # content hash -> tokens, this job's sets
        self._scorers: dict[str, CiderD] = {}  # content hash of a corpus -> its CIDEr-D

    @property
    def java(self) -> str:
        """The `java` executable, looked up when a tool first needs it."""
        return java_executable()

    def __enter__(self) -> CocoTools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for server in self._meteors:
            server.close()
        self._meteors = []

    def tokenize(self, texts: Sequence[str], then: str | None = None) -> list[str]:
        """PTB-tokenise, lower-case and drop punctuation tokens (pycocoevalcap PTBTokenizer);
        a long list is cut into parts tokenised by up to `workers` JVMs side by side. `then`:
        the text that follows `texts` in the one file a serial run would tokenise (None: the
        end of the file). The tokenizer reads past a line's end (a final "a." stays one
        token before the end of the file, and is split before a capitalised line), so each
        part is tokenised with the line that follows it and that line's tokens are dropped:
        the parts give the serial file's tokens."""
        lines = [_clean(t) for t in texts]
        if not lines:
            return []
        parts = min(self.workers, -(-len(lines) // PTB_LINES_PER_JVM))
        bounds = chunk_bounds(len(lines), parts)
        follows = [lines[end] for _, end in bounds[:-1]] + [None if then is None else _clean(then)]
        self.launches["ptb"] += len(bounds)
        if len(bounds) == 1:
            return self._run_ptb(lines, follows[0])
        with ThreadPoolExecutor(len(bounds)) as pool:
            done = pool.map(lambda b, f: self._run_ptb(lines[b[0] : b[1]], f), bounds, follows)
            return [t for part in done for t in part]

    def _run_ptb(self, lines: Sequence[str], then: str | None) -> list[str]:
        """The tokens of `lines`, tokenised with the line `then` after them (not returned)."""
        text = [*lines] if then is None else [*lines, then]
        with tempfile.TemporaryDirectory(prefix="distinctcap-ptb-") as tmp:
            path = Path(tmp) / "captions.txt"
            path.write_text("\n".join(text) + "\n", encoding="utf-8")
            cmd = [
                self.java,
                *PTB_JIT_OPTIONS,
                "-cp",
                str(PTB_JAR),
                "edu.stanford.nlp.process.PTBTokenizer",
                "-preserveLines",
                "-lowerCase",
                "-encoding",
                "utf-8",
                str(path),
            ]
            proc = subprocess.run(cmd, capture_output=True, cwd=tmp)
        out = proc.stdout.decode("utf-8").split("\n")
        if proc.returncode != 0 or len(out) != len(text) + 1:
            raise DistinctcapError(
                f"PTB tokenizer failed (exit {proc.returncode}, {len(out) - 1} lines for "
                f"{len(text)} captions): {proc.stderr.decode(errors='replace')[-2000:]}"
            )
        return [" ".join(w for w in line.split() if w not in _PUNCT) for line in out[: len(lines)]]

    def tokenize_groups(
        self, *groups: Captions, keep: Collection[int] = ()
    ) -> list[dict[Hashable, list[str]]]:
        """Tokenise several {id: captions} mappings as one file of all their captions in
        order (the tokens a single tokenizer launch gives). The groups at the positions in
        `keep` (reference sets) are tokenised once per session and, with a `cache_dir`, found
        there by content hash (with the line that follows them) by later sessions."""
        flats = [[c for caps in group.values() for c in caps] for group in groups]
        then = [next((f[0] for f in flats[k + 1 :] if f), None) for k in range(len(flats))]
        keys = {k: _content_key([*flats[k], f"\x1fthen {then[k]}"]) for k in keep if flats[k]}
        known = {k: self._known_tokens(key) for k, key in keys.items()}
        stale = [k for k, tokens in known.items() if tokens and len(tokens) != len(flats[k])]
        todo = [k for k in range(len(groups)) if known.get(k) is None or k in stale]
        for run in _consecutive(todo):
            tokens = iter(self.tokenize([c for k in run for c in flats[k]], then[run[-1]]))
            for k in run:
                known[k] = [next(tokens) for _ in flats[k]]
                if k in keys:
                    self._store_tokens(keys[k], known[k])
        out = []
        for k, group in enumerate(groups):
            it = iter(known[k])
            out.append({key: [next(it) for _ in caps] for key, caps in group.items()})
        return out

    def _known_tokens(self, key: str) -> list[str] | None:
        if key not in self._tokens and self.cache_dir is not None:
            path = self.cache_dir / f"ptb-{key}.txt.gz"
            if path.is_file():
                self._tokens[key] = gzip.decompress(path.read_bytes()).decode().split("\n")
        return self._tokens.get(key)

    def _store_tokens(self, key: str, tokens: list[str]) -> None:
        self._tokens[key] = tokens
        if self.cache_dir is not None:
            with atomic_path(self.cache_dir / f"ptb-{key}.txt.gz") as tmp:
                tmp.write_bytes(gzip.compress("\n".join(tokens).encode(), compresslevel=1))

    def cider_d(self, documents: Captions) -> CiderD:
        """CIDEr-D with the document frequencies of `documents` (tokenised, one caption
        group per image), built once per session for the same corpus."""
        key = _content_key(["\x1f".join(caps) for caps in documents.values()])
        if key not in self._scorers:
            self._scorers[key] = CiderD(documents.values())
        return self._scorers[key]

    def _meteor(self, k: int) -> _Meteor:
        while len(self._meteors) <= k:
            self.launches["meteor"] += 1
            self._meteors.append(_Meteor(self.java, self.meteor_memory))
        return self._meteors[k]

    def start_meteor(self) -> None:
        """Start the first METEOR server now, so that its paraphrase table (~15 CPU s) loads
        while the tokenizer and the n-gram metrics run."""
        self._meteor(0)

    def meteor(self, pairs: Sequence[Pair]) -> tuple[float, list[float]]:
        """Corpus METEOR and per-pair scores over (candidate, references) pairs."""
        return self._meteor(0).score(pairs)

    def meteor_segments(self, pairs: Sequence[Pair]) -> list[float]:
        """Per-pair METEOR of many pairs: each distinct pair once, cut over the servers of
        `meteor_server_count` side by side (a pair's score depends on its own statistics
        only, so neither the split nor the deduplication changes a digit)."""
        keys = [_pair_key(pair) for pair in pairs]
        unique = list(dict.fromkeys(keys))
        bounds = chunk_bounds(len(unique), meteor_server_count(len(unique), self.workers))
        if len(bounds) <= 1:
            scores = self.meteor(unique)[1]
        else:
            servers = [self._meteor(k) for k in range(len(bounds))]  # they load side by side
            parts = [unique[a:b] for a, b in bounds]
            with ThreadPoolExecutor(len(bounds)) as pool:
                done = pool.map(lambda server, part: server.score(part)[1], servers, parts)
                scores = [s for part in done for s in part]
        by_key = dict(zip(unique, scores, strict=True))
        return [by_key[k] for k in keys]

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
                *spice_speed_options(self.workers, self.cache_dir, tmp),
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


def meteor_server_count(pairs: int, workers: int) -> int:
    """METEOR servers for `pairs` distinct pairs on a job of `workers` cores: one per
    METEOR_PAIRS_PER_SERVER pairs, at most half the cores (they score beside the forked
    Python workers; a further server's ~15 CPU s start only pays where a core is free) and
    MAX_METEOR_SERVERS."""
    wanted = -(-pairs // METEOR_PAIRS_PER_SERVER)
    return max(1, min(wanted, -(-workers // 2), MAX_METEOR_SERVERS))


def spice_speed_options(workers: int, cache_dir: Path | None, tmp: str) -> list[str]:
    """SPICE's `-threads` (its parser on the job's cores, not the machine's) and `-cache`
    (SPICE's own store of each sentence's parse: under `cache_dir`, so later jobs and runs
    parse a reference set once, else in the call's temporary folder)."""
    cache = Path(cache_dir) / "spice" if cache_dir is not None else Path(tmp) / "spice-cache"
    cache.mkdir(parents=True, exist_ok=True)
    return ["-threads", str(max(1, workers)), "-cache", str(cache)]


def _consecutive(positions: Sequence[int]) -> list[list[int]]:
    """[0, 1, 3] -> [[0, 1], [3]]: runs of consecutive positions."""
    runs: list[list[int]] = []
    for k in positions:
        if runs and runs[-1][-1] == k - 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs


def _content_key(lines: Sequence[str]) -> str:
    """sha256 of the tokenizer's jar name and the lines: a cache key for their tokens."""
    digest = hashlib.sha256(PTB_JAR.name.encode())
    for line in lines:
        digest.update(line.encode())
        digest.update(b"\n")
    return digest.hexdigest()


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
    count_scored([m for m in QUALITY_METRICS if m in out.values], len(pairs))
    return out


def count_scored(metrics: Sequence[str], pairs: int) -> None:
    """The work record's `<metric>_scored` (distinctcap.core.work): the pairs each metric was
    asked to score, before the caches and deduplication (which depend on what ran before), so
    the count is the same whatever order the jobs ran in."""
    for m in metrics:
        work.count(f"{m}_scored", pairs)


def per_item_scores(
    pairs: Sequence[Pair],
    documents: Sequence[Sequence[str]],
    metrics: Sequence[str],
    tools: CocoTools,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Each pair's sentence-level score for every metric.

    Pairs are tokenised (candidate, references). CIDEr-D takes its idf from `documents` (the
    reference sets of the distinct images), so scoring many samples of one image at once gives
    the same number as scoring them one evaluation at a time. BLEU, ROUGE-L and CIDEr-D score
    parts of the pairs in the session's forked workers while METEOR's servers score theirs
    (a pair's sentence-level score depends on that pair only, so the parts change no digit).
    Returns ({metric: (P,)}, skipped).
    """
    unknown = set(metrics) - set(QUALITY_METRICS)
    if unknown:
        raise DistinctcapError(f"unknown metrics {sorted(unknown)}; allowed: {QUALITY_METRICS}")
    python = [m for m in metrics if m.startswith("bleu") or m in ("rouge_l", "cider")]
    cider = CiderD(documents) if "cider" in metrics else None
    bounds = chunk_bounds(len(pairs), tools.workers * CHUNKS_PER_WORKER) if pairs else []

    def java() -> list[float] | None:
        return tools.meteor_segments(pairs) if "meteor" in metrics else None

    parts, meteor = fork_map_beside(
        lambda b: _python_scores(pairs[b[0] : b[1]], python, cider), bounds, tools.workers, java
    )
    scores = {m: np.concatenate([p[m] for p in parts]) for m in python} if parts else {}
    if meteor is not None:
        scores["meteor"] = np.asarray(meteor, dtype=float)
    skipped: dict[str, str] = {}
    if "spice" in metrics:
        spice = tools.spice(pairs)
        if spice is None:
            skipped["spice"] = tools.spice_skip_reason
            scores["spice"] = np.full(len(pairs), math.nan)
        else:
            scores["spice"] = np.asarray(spice, dtype=float)
    count_scored([m for m in metrics if m not in skipped], len(pairs))
    return {m: scores.get(m, np.zeros(0)) for m in metrics}, skipped


def _python_scores(
    pairs: Sequence[Pair], metrics: Sequence[str], cider: CiderD | None
) -> dict[str, np.ndarray]:
    """BLEU-1..4, ROUGE-L and CIDEr-D (those in `metrics`) of each pair: one scorer call per
    metric."""
    scores: dict[str, np.ndarray] = {}
    if any(m.startswith("bleu") for m in metrics):
        bleu = _bleu_scores(pairs)
        scores.update({f"bleu{k + 1}": np.asarray(b, dtype=float) for k, b in enumerate(bleu)})
    if "rouge_l" in metrics:
        scores["rouge_l"] = np.array([rouge_l(h, refs) for h, refs in pairs], dtype=float)
    if cider is not None:
        scores["cider"] = _cider_scores(pairs, cider)
    return {m: scores[m] for m in metrics}


def _bleu_scores(pairs: Sequence[Pair]) -> list[list[float]]:
    """Bleu(4).compute_score's per-pair BLEU-1..4 lists, by its own BleuScorer, with each run
    of pairs with the same references (an image's samples) cooking them once."""
    scorer = BleuScorer(n=4)
    for refs, run in itertools.groupby(pairs, key=lambda pair: tuple(pair[1])):
        cooked = cook_refs(refs)
        scorer.ctest.extend(cook_test(hyp, cooked) for hyp, _ in run)
    scorer.crefs = [None] * len(scorer.ctest)
    return scorer.compute_score(option="closest", verbose=0)[1]


def rouge_l(candidate: str, references: Sequence[str]) -> float:
    """pycocoevalcap's `Rouge().calc_score([candidate], references)`, the same float, with
    the longest common subsequence counted bit-parallel (Hyyrö 2004) instead of by its
    per-cell Python table; words are split on single spaces, as there."""
    words = candidate.split(" ")
    masks: dict[str, int] = {}
    for k, word in enumerate(words):
        masks[word] = masks.get(word, 0) | 1 << k
    prec, rec = [], []
    for reference in references:
        ref_words = reference.split(" ")
        lcs = _lcs_length(ref_words, masks, len(words))
        prec.append(lcs / float(len(words)))
        rec.append(lcs / float(len(ref_words)))
    prec_max, rec_max = max(prec), max(rec)
    if prec_max == 0 or rec_max == 0:
        return 0.0
    beta = ROUGE_BETA
    return ((1 + beta**2) * prec_max * rec_max) / float(rec_max + beta**2 * prec_max)


def _lcs_length(words: Sequence[str], masks: dict[str, int], length: int) -> int:
    """Length of the longest common subsequence of `words` and the `length` words whose
    positions `masks` holds (word -> bit set of its positions)."""
    row = (1 << length) - 1
    for word in words:
        match = row & masks.get(word, 0)
        row = (row + match) | (row - match)
    return length - (row & ((1 << length) - 1)).bit_count()


def _cider_scores(pairs: Sequence[Pair], cider: CiderD) -> np.ndarray:
    """CIDEr-D of each pair; a run of pairs with the same references (an image's samples) is
    scored by one `CiderD.scores` call."""
    runs = itertools.groupby(pairs, key=lambda pair: tuple(pair[1]))
    parts = [cider.scores([h for h, _ in run], refs) for refs, run in runs]
    return np.concatenate(parts) if parts else np.zeros(0)
