"""Resumable, verified HTTP downloads with the standard library only.

`download(url, dest)` streams into `dest + ".part"`, continuing from the part's size with an
HTTP Range request, retries connection errors and 5xx answers with exponential backoff, checks
the size (and md5 where known), and only then renames the part to `dest`. A `dest` that is
already there and verifies is not fetched again.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.logs import progress

log = logging.getLogger(__name__)

CHUNK = 1 << 20
# Failures worth another try: the connection broke or the server had a transient problem.
RETRYABLE = (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError)


class _Interrupted(Exception):
    """The transfer stopped early (retryable); carries whether bytes were gained."""


def md5sum(path: str | os.PathLike) -> str:
    """Hex md5 of a file, read in 1 MiB chunks."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def verify(path: str | os.PathLike, size: int | None = None, md5: str | None = None) -> None:
    """Raise DistinctcapError naming the file, expected and got, if size or md5 differ."""
    path = Path(path)
    got_size = path.stat().st_size
    if size is not None and got_size != size:
        raise DistinctcapError(f"{path}: size mismatch, expected {size} bytes, got {got_size}")
    if md5 is not None:
        got = md5sum(path)
        if got.lower() != md5.lower():
            raise DistinctcapError(f"{path}: md5 mismatch, expected {md5.lower()}, got {got}")


def download(
    url: str,
    dest: str | os.PathLike,
    size: int | None = None,
    md5: str | None = None,
    retries: int = 5,
    backoff: float = 1.0,
    timeout: float = 30,
) -> Path:
    """Fetch `url` to `dest` unless `dest` is already complete; return `dest`.

    Resumes a previous `dest.part` with `Range: bytes=<part size>-`; a server that answers 200
    instead of 206 restarts the part from zero. Up to `retries` consecutive attempts that gain no
    bytes are retried after `backoff * 2**k` seconds (k = 0, 1, ...); an attempt that gains
    bytes resets that count, and the whole loop is capped at 100 * (retries + 1) attempts.
    Expected size: `size`, else the server's Content-Length / Content-Range total. On an md5 or
    size mismatch the part is deleted (resuming corrupt bytes would never succeed) and a
    DistinctcapError names the file, expected and got. 4xx answers fail at once.
    """
    dest = Path(dest)
    if dest.exists():
        try:
            verify(dest, size, md5)
            log.info("%s is complete, skipping download", dest)
            return dest
        except DistinctcapError as err:
            log.warning("%s; downloading it again", err)
            dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    failures, expected = 0, size
    for _ in range(100 * (retries + 1)):
        before = part.stat().st_size if part.exists() else 0
        try:
            expected = _fetch(url, part, expected, timeout)
            break
        except (_Interrupted, *RETRYABLE) as err:
            if isinstance(err, urllib.error.HTTPError) and err.code < 500:
                raise DistinctcapError(f"{url}: HTTP {err.code} {err.reason}") from err
            gained = (part.stat().st_size if part.exists() else 0) > before
            failures = 0 if gained else failures + 1
            if failures > retries:
                raise DistinctcapError(
                    f"{url}: download failed after {retries} retries: {err}"
                ) from err
            delay = backoff * 2 ** max(failures - 1, 0)
            log.warning("%s: %s; retrying in %.1f s", url, err, delay)
            time.sleep(delay)
    else:
        raise DistinctcapError(f"{url}: gave up after {100 * (retries + 1)} attempts")
    try:
        verify(part, size if size is not None else expected, md5)
    except DistinctcapError as err:
        part.unlink()
        raise DistinctcapError(
            f"{err} (downloaded from {url}; the partial file was removed)"
        ) from None
    os.replace(part, dest)
    return dest


def _fetch(url: str, part: Path, expected: int | None, timeout: float) -> int | None:
    """One attempt: append to `part` from its current size; return the expected total size."""
    offset = part.stat().st_size if part.exists() else 0
    if expected is not None and offset == expected:
        return expected  # a previous attempt finished the bytes; only verification is left
    if expected is not None and offset > expected:
        part.unlink()
        offset = 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416:  # the range starts at or past the end: the part holds everything
            total = _content_range_total(err.headers.get("Content-Range"))
            if total is not None and total == offset and expected in (None, total):
                return total
            part.unlink()
            raise _Interrupted(f"HTTP 416 for a {offset}-byte part; restarting") from err
        raise
    with response:
        if response.status == 206:
            start = _content_range_start(response.headers.get("Content-Range"))
            if start != offset:
                part.unlink()
                raise _Interrupted(f"server resumed at byte {start}, not {offset}; restarting")
            total = _content_range_total(response.headers.get("Content-Range"))
        else:  # 200: the server ignored Range, so the body is the whole file
            offset = 0
            length = response.headers.get("Content-Length")
            total = int(length) if length is not None else None
        if expected is not None and total is not None and total != expected:
            raise DistinctcapError(
                f"{url}: size mismatch, expected {expected} bytes, the server has {total}"
            )
        expected = expected if expected is not None else total
        _stream(response, part, offset, expected, url)
    got = part.stat().st_size
    if expected is not None and got < expected:
        raise _Interrupted(f"connection ended at byte {got} of {expected}")
    return expected


def _stream(response, part: Path, offset: int, total: int | None, url: str) -> None:
    mode = "ab" if offset else "wb"
    name = url.rsplit("/", 1)[-1]
    with (
        open(part, mode) as f,
        progress(
            total=total,
            initial=offset,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=name,
            leave=False,
        ) as bar,
    ):
        while block := response.read(CHUNK):
            f.write(block)
            bar.update(len(block))


def remote_size(url: str, timeout: float = 5) -> int | None:
    """The size a HEAD request for `url` answers (Content-Length), or None when the server
    cannot be reached or does not say: an estimate's input, never a check."""
    request = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
    except (*RETRYABLE, ValueError):
        return None
    return int(length) if length and length.isdigit() else None


def _content_range_start(header: str | None) -> int | None:
    match = re.match(r"bytes (\d+)-\d+/", header or "")
    return int(match.group(1)) if match else None


def _content_range_total(header: str | None) -> int | None:
    match = re.search(r"/(\d+)\s*$", header or "")
    return int(match.group(1)) if match else None
