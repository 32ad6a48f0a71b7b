"""A local mirror of COCO's download servers: the official archives at their official URL paths
under one folder, served on 127.0.0.1 with Range support, so that `data.coco.base_url` points the
real download code at it (the mini-COCO of the tests, the synthetic COCO of bench/rehearsal.py).

`MirrorServer(directory)` answers GET and HEAD (a file's size: the preflight's disk estimate),
logs every request and can drop a connection after N body bytes once, answer an error status
once, or ignore Range headers (the downloader's failure tests); bodies are streamed from disk,
so a mirror of COCO's size (tens of GB) serves in constant memory.
"""

from __future__ import annotations

import re
import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from distinctcap.data.coco import ARCHIVES

CHUNK = 1 << 20
# What each official archive holds: folders or files, relative to an extracted root.
ARCHIVE_MEMBERS = {
    "train2014.zip": ("train2014",),
    "val2014.zip": ("val2014",),
    "train2017.zip": ("train2017",),
    "val2017.zip": ("val2017",),
    "annotations_trainval2014.zip": (
        "annotations/captions_train2014.json",
        "annotations/captions_val2014.json",
    ),
    "annotations_trainval2017.zip": (
        "annotations/captions_train2017.json",
        "annotations/captions_val2017.json",
    ),
    "caption_datasets.zip": ("dataset_coco.json",),
}


def archive_path(name: str) -> str:
    """Where archive `name` lies under a mirror's folder: its official URL's path."""
    return urlsplit(ARCHIVES[name].url).path.lstrip("/")


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args) -> None:  # keep output quiet
        pass

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
        path = self.path.split("?")[0]
        file = self.server.state.directory / path.lstrip("/")
        with self.server.state.lock:
            self.server.state.heads.append(path)
        if not file.is_file():
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(file.stat().st_size))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        state = self.server.state
        path = self.path.split("?")[0]
        file = state.directory / path.lstrip("/")
        header = self.headers.get("Range")
        with state.lock:
            status = state.fail_once.pop(path, None)
            drop = state.drop_after.pop(path, None)
        if status is None and not file.is_file():
            status = 404
        if status is not None:
            state.log(path, header, status)
            self.send_error(status)
            return
        size = file.stat().st_size
        start, code = 0, 200
        match = re.fullmatch(r"bytes=(\d+)-", header or "")
        if match and not state.ignore_range:
            start, code = int(match.group(1)), 206
            if start >= size:
                state.log(path, header, 416)
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        state.log(path, header, code)
        self.send_response(code)
        if code == 206:
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.send_header("Content-Length", str(size - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        with file.open("rb") as body:
            body.seek(start)
            if drop is None:
                shutil.copyfileobj(body, self.wfile, CHUNK)
                return
            self.wfile.write(body.read(drop))
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)  # the client sees a short body
        self.close_connection = True


class _State:
    def __init__(self, directory: Path):
        self.directory = directory
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.heads: list[str] = []
        self.fail_once: dict[str, int] = {}
        self.drop_after: dict[str, int] = {}
        self.ignore_range = False

    def log(self, path: str, range_header: str | None, status: int) -> None:
        with self.lock:
            self.requests.append({"path": path, "range": range_header, "status": status})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: _State


class MirrorServer:
    """Serve `directory` on 127.0.0.1 from a background thread, on `port` (0: an ephemeral one).

    `requests`: [{"path", "range", "status"}] of the GETs; `heads`: the paths asked by HEAD;
    `drop_after[path] = n`: the next GET of path sends n body bytes and then closes the
    connection; `fail_once[path] = status`: the next GET answers that status;
    `ignore_range = True`: answer 200 with the whole file to Range requests.
    """

    def __init__(self, directory: str | Path, port: int = 0):
        self._httpd = _Server(("127.0.0.1", port), _Handler)
        self._httpd.state = self.state = _State(Path(directory))
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def requests(self) -> list[dict]:
        return self.state.requests

    @property
    def heads(self) -> list[str]:
        return self.state.heads

    def __enter__(self) -> MirrorServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)
