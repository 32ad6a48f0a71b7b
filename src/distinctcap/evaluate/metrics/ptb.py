"""The PTB tokenizer of the COCO caption metrics (pycocoevalcap's PTBTokenizer: Stanford
CoreNLP 3.4.1, lower-cased, punctuation tokens dropped), run on private temporary files so
evaluations work from a read-only venv and side by side.

A long list of captions is cut into parts tokenised by several JVMs at once (`tokenize`); a
reference set is tokenised once per session and, with a cache folder, once for every later
job and run: its tokens are kept by content hash (`tokenize_groups`, `TokenCache`). The
training captions (591,753 for COCO) stream instead (`stream_tokens`): a part of the images at
a time, so neither their tokens nor the tokenizer's buffers of the whole set are ever held.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from pycocoevalcap.tokenizer import ptbtokenizer

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path
from distinctcap.evaluate.metrics.java import (
    JVM_WARNINGS_TO_STDERR,
    PYCOCOEVALCAP,
    java_executable,
    one_line,
)
from distinctcap.evaluate.metrics.parallel import chunk_bounds

Captions = Mapping[Hashable, Sequence[str]]

PTB_JAR = PYCOCOEVALCAP / "tokenizer" / "stanford-corenlp-3.4.1.jar"
_PUNCT = frozenset(ptbtokenizer.PUNCTUATIONS)
# A tokenizer JVM per this many captions at most (its start is ~1 CPU s), up to `workers`.
PTB_LINES_PER_JVM = 20_000
# The tokenizer's JVMs run with the client compiler only: a launch lives seconds, too short
# for C2's optimising compiles to repay their CPU (METEOR's servers keep Java's default tiered
# compiler: distinctcap.evaluate.metrics.meteor). Scores are the same either way (Java's
# floating point is strict since 17).
PTB_JIT_OPTIONS = ("-XX:TieredStopAtLevel=1",)
# Captions of a stream tokenised per part (`stream_tokens`), times the job's cores (at least 4):
# a part's transient texts stay ~10 MB a core, and the parts cost a tokenizer start (~0.5 s
# wall) per 80,000 captions over one long run: 7 more starts for COCO's training captions.
STREAM_LINES_PER_WORKER = 20_000
READ_CHARS = 1 << 22  # characters of a stored token file read at a time


def tokenize(
    texts: Sequence[str], workers: int, launches: Counter, then: str | None = None
) -> list[str]:
    """PTB-tokenise, lower-case and drop punctuation tokens (pycocoevalcap PTBTokenizer);
    a long list is cut into parts tokenised by up to `workers` JVMs side by side (each start
    counted in `launches["ptb"]`). `then`: the text that follows `texts` in the one file a
    serial run would tokenise (None: the end of the file). The tokenizer reads past a line's
    end (a final "a." stays one token before the end of the file, and is split before a
    capitalised line), so each part is tokenised with the line that follows it and that line's
    tokens are dropped: the parts give the serial file's tokens."""
    lines = [one_line(t) for t in texts]
    if not lines:
        return []
    parts = min(workers, -(-len(lines) // PTB_LINES_PER_JVM))
    bounds = chunk_bounds(len(lines), parts)
    follows = [lines[end] for _, end in bounds[:-1]] + [None if then is None else one_line(then)]
    launches["ptb"] += len(bounds)
    if len(bounds) == 1:
        return run_ptb(lines, follows[0])
    with ThreadPoolExecutor(len(bounds)) as pool:
        done = pool.map(lambda b, f: run_ptb(lines[b[0] : b[1]], f), bounds, follows)
        return [t for part in done for t in part]


def run_ptb(lines: Sequence[str], then: str | None) -> list[str]:
    """The tokens of `lines`, tokenised with the line `then` after them (not returned)."""
    text = [*lines] if then is None else [*lines, then]
    with tempfile.TemporaryDirectory(prefix="distinctcap-ptb-") as tmp:
        path = Path(tmp) / "captions.txt"
        path.write_text("\n".join(text) + "\n", encoding="utf-8")
        cmd = [
            java_executable(),
            *JVM_WARNINGS_TO_STDERR,
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
            f"{len(text)} captions; output begins {out[0][:200]!r}): "
            f"{proc.stderr.decode(errors='replace')[-2000:]}"
        )
    return [" ".join(w for w in line.split() if w not in _PUNCT) for line in out[: len(lines)]]


class TokenCache:
    """Tokens of reference sets by content key (`content_key`): in memory for the session and,
    with a `folder`, as `ptb-<key>.txt.gz` for later sessions (jobs and runs). A streamed set's
    tokens (`stream_tokens`) go only to the file, a part at a time (`lines`, `writer`)."""

    def __init__(self, folder: str | Path | None = None):
        self.folder = None if folder is None else Path(folder)
        self.tokens: dict[str, list[str]] = {}

    def _path(self, key: str) -> Path | None:
        return None if self.folder is None else self.folder / f"ptb-{key}.txt.gz"

    def known(self, key: str) -> list[str] | None:
        path = self._path(key)
        if key not in self.tokens and path is not None and path.is_file():
            self.tokens[key] = gzip.decompress(path.read_bytes()).decode().split("\n")
        return self.tokens.get(key)

    def store(self, key: str, tokens: list[str]) -> None:
        self.tokens[key] = tokens
        with self.writer(key) as write:
            write(tokens)

    def lines(self, key: str, count: int) -> Iterator[str] | None:
        """The stored tokens of `key` one at a time (those `known` would split from the file,
        read a block at a time), if the file holds exactly `count` of them; else None."""
        path = self._path(key)
        if path is None or not path.is_file():
            return None
        if sum(1 for _ in _split_lines(path)) != count:  # a stale or cut file: tokenise again
            return None
        return _split_lines(path)

    @contextmanager
    def writer(self, key: str) -> Iterator[Callable[[Sequence[str]], None]]:
        """`write(tokens)` appends tokens to the file of `key` (none without a folder); the
        file appears, whole, when the block ends without an error (core.io.atomic_path)."""
        path = self._path(key)
        if path is None:
            yield lambda tokens: None
            return
        with atomic_path(path) as tmp, gzip.open(tmp, "wb", compresslevel=1) as out:
            first = [True]

            def write(tokens: Sequence[str]) -> None:
                if tokens:
                    out.write(("" if first[0] else "\n").encode() + "\n".join(tokens).encode())
                    first[0] = False

            yield write


def _split_lines(path: Path) -> Iterator[str]:
    """`gzip.decompress(path.read_bytes()).decode().split("\\n")`, a block at a time."""
    with gzip.open(path, "rt", encoding="utf-8", newline="") as text:
        rest = ""
        while block := text.read(READ_CHARS):
            *done, rest = (rest + block).split("\n")
            yield from done
        yield rest


def stream_key(group: Captions) -> str:
    """The cache key of a group that ends its file (`tokenize_groups`' key of a last group)."""
    return content_key(itertools.chain(_flat(group), ["\x1fthen None"]))


def stream_tokens(
    group: Captions,
    tokenize: Callable[[list[str], str | None], list[str]],
    cache: TokenCache,
    lines: int,
    key: str | None = None,
) -> Iterator[list[list[str]]]:
    """The tokens of a {id: captions} mapping at the end of a file (those `tokenize_groups`
    gives its last group), as each image's token list, about `lines` captions of images at a
    time in the mapping's order. Each part is tokenised with the first line of the next (the
    tokenizer reads past a line's end), so the parts give the whole file's tokens. The tokens
    are read from / written to `cache`'s file of `key` (`stream_key`) as they stream, never
    kept: what a caller needs of them it keeps itself (evaluate.metrics.training)."""
    parts = _image_parts(group, lines)
    count = sum(len(caps) for caps in group.values())
    if not count:  # no file to read or write
        yield from ([[] for _ in part] for part in parts)
        return
    key = key or stream_key(group)
    stored = cache.lines(key, count)
    if stored is not None:
        for part in parts:
            yield [[next(stored) for _ in caps] for caps in part]
        return
    firsts = [next(iter(_flat_part(part)), None) for part in parts]
    with cache.writer(key) as write:
        for k, part in enumerate(parts):
            then = next((f for f in firsts[k + 1 :] if f is not None), None)
            flat = list(_flat_part(part))
            tokens = tokenize(flat, then) if flat else []
            del flat
            write(tokens)
            it = iter(tokens)
            yield [[next(it) for _ in caps] for caps in part]


def _image_parts(group: Captions, lines: int) -> list[list[Sequence[str]]]:
    """The images' caption lists cut into parts of at least `lines` captions (the last fewer)."""
    parts: list[list[Sequence[str]]] = [[]]
    size = 0
    for caps in group.values():
        if size >= lines:
            parts.append([])
            size = 0
        parts[-1].append(caps)
        size += len(caps)
    return parts


def _flat_part(part: Iterable[Sequence[str]]) -> Iterator[str]:
    return itertools.chain.from_iterable(part)


def _flat(group: Captions) -> Iterator[str]:
    return itertools.chain.from_iterable(group.values())


def tokenize_groups(
    groups: Sequence[Captions],
    keep: Collection[int],
    tokenize: Callable[[list[str], str | None], list[str]],
    cache: TokenCache,
    last: str | None = None,
) -> list[dict[Hashable, list[str]]]:
    """Tokenise several {id: captions} mappings as one file of all their captions in order
    followed by the line `last` (None: the end of the file; the tokens a single tokenizer
    launch gives), with `tokenize(lines, then)`. The groups at the positions in `keep`
    (reference sets) are found in `cache` by content (with the line that follows them) or
    tokenised and stored there."""
    flats = [[c for caps in group.values() for c in caps] for group in groups]
    then = [next((f[0] for f in flats[k + 1 :] if f), last) for k in range(len(flats))]
    keys = {k: content_key([*flats[k], f"\x1fthen {then[k]}"]) for k in keep if flats[k]}
    known = {k: cache.known(key) for k, key in keys.items()}
    stale = [k for k, tokens in known.items() if tokens and len(tokens) != len(flats[k])]
    todo = [k for k in range(len(groups)) if known.get(k) is None or k in stale]
    for run in _consecutive(todo):
        tokens = iter(tokenize([c for k in run for c in flats[k]], then[run[-1]]))
        for k in run:
            known[k] = [next(tokens) for _ in flats[k]]
            if k in keys:
                cache.store(keys[k], known[k])
    out = []
    for k, group in enumerate(groups):
        it = iter(known[k])
        out.append({key: [next(it) for _ in caps] for key, caps in group.items()})
    return out


def _consecutive(positions: Sequence[int]) -> list[list[int]]:
    """[0, 1, 3] -> [[0, 1], [3]]: runs of consecutive positions."""
    runs: list[list[int]] = []
    for k in positions:
        if runs and runs[-1][-1] == k - 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs


def content_key(lines: Iterable[str]) -> str:
    """sha256 of the tokenizer's jar name and the lines: a cache key for their tokens."""
    digest = hashlib.sha256(PTB_JAR.name.encode())
    for line in lines:
        digest.update(line.encode())
        digest.update(b"\n")
    return digest.hexdigest()
