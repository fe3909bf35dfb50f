"""``pflarena data fetch``: archives downloaded from a loopback HTTP server (no network),
checked against their checksum, continued after a cut with an HTTP Range request, and
never left half-written where a loader reads; LEAF's data sets answered with what to run."""

from __future__ import annotations

import hashlib
import io
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pflarena.cli import main
from pflarena.core.datasets import check_files, har_paths
from pflarena.core.datasets.fetch import ARCHIVES, Archive, FetchError, download, fetch_dataset


def _har_archive() -> bytes:
    """UCI's download in small: a zip wrapping ``UCI HAR Dataset.zip`` (plus macOS litter)."""
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as archive:
        for split in ("train", "test"):
            for path in har_paths(Path("."), split):
                archive.writestr(path.as_posix(), f"{path.name}\n")
    outer = io.BytesIO()
    with zipfile.ZipFile(outer, "w") as archive:
        archive.writestr("UCI HAR Dataset.zip", inner.getvalue())
        archive.writestr("__MACOSX/._UCI HAR Dataset.zip", b"x")
        archive.writestr("UCI HAR Dataset.names", "names\n")
    return outer.getvalue()


class _Server:
    """Serves ``files`` (path -> bytes) with Range support; ``cut`` bytes: the first
    response stops after that many bytes (a dropped connection); ``ignore_range``: answers
    every request with the whole file."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files, self.cut, self.ignore_range, self.ranges = files, None, False, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                header = self.headers.get("Range")
                server.ranges.append(header)
                start = 0
                if header and not server.ignore_range:
                    start = int(header.removeprefix("bytes=").split("-")[0])
                    if start >= len(body):
                        self.send_response(416)
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                payload = body[start:]
                if server.cut is not None:
                    payload, server.cut = payload[: server.cut], None
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def har_server(monkeypatch):
    body = _har_archive()
    server = _Server({"/har.zip": body})
    archive = Archive(
        url=server.url("/har.zip"),
        filename="har.zip",
        checksum="sha256:" + hashlib.sha256(body).hexdigest(),
        root="UCI HAR Dataset",
        inner="UCI HAR Dataset.zip",
    )
    monkeypatch.setitem(ARCHIVES, "har", archive)
    yield server, body, archive
    server.close()


def test_fetch_downloads_checks_and_unpacks_where_the_loader_reads(tmp_path, har_server, capsys):
    server, _, _ = har_server
    assert main(["data", "fetch", "har", "--data-dir", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"har fetched into {tmp_path}: use --data-dir {tmp_path}" in out
    check_files("har", tmp_path)  # the layout the loader reads
    assert (tmp_path / "UCI HAR Dataset" / "train" / "y_train.txt").read_text() == "y_train.txt\n"
    # the archive, its .part and the scratch folder are gone; nothing else was left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["UCI HAR Dataset"]
    # a second fetch finds it there and downloads nothing
    requests = len(server.ranges)
    assert main(["data", "fetch", "har", "--data-dir", str(tmp_path)]) == 0
    assert "already in" in capsys.readouterr().out and len(server.ranges) == requests


def test_a_cut_download_is_kept_as_part_and_continued_with_a_range_request(tmp_path, har_server):
    server, body, archive = har_server
    dest = tmp_path / "har.zip"
    server.cut = len(body) // 3
    with pytest.raises(FetchError, match="the same command continues it"):
        download(archive.url, dest, archive.checksum, progress=False)
    part = tmp_path / "har.zip.part"
    assert part.stat().st_size == len(body) // 3 and not dest.exists()
    download(archive.url, dest, archive.checksum, progress=False)
    assert server.ranges == [None, f"bytes={len(body) // 3}-"]
    assert dest.read_bytes() == body and not part.exists()


def test_a_server_that_ignores_range_is_read_from_the_start_again(tmp_path, har_server):
    server, body, archive = har_server
    (tmp_path / "har.zip.part").write_bytes(body[:100])
    server.ignore_range = True
    download(archive.url, tmp_path / "har.zip", archive.checksum, progress=False)
    assert (tmp_path / "har.zip").read_bytes() == body


def test_a_bad_checksum_leaves_nothing_in_place_and_says_so(
    tmp_path, har_server, monkeypatch, capsys
):
    _, _, archive = har_server
    wrong = Archive(
        archive.url, archive.filename, "sha256:" + "0" * 64, archive.root, archive.inner
    )
    monkeypatch.setitem(ARCHIVES, "har", wrong)
    assert main(["data", "fetch", "har", "--data-dir", str(tmp_path), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "checksum mismatch" in err and "nothing was put in place" in err
    assert len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_an_archive_reaching_outside_its_folder_is_refused(tmp_path):
    bad = io.BytesIO()
    with zipfile.ZipFile(bad, "w") as archive:
        archive.writestr("../evil.txt", "x")
        archive.writestr("root/ok.txt", "x")
    body = bad.getvalue()
    server = _Server({"/bad.zip": body})
    try:
        archive = Archive(
            server.url("/bad.zip"), "bad.zip", "md5:" + hashlib.md5(body).hexdigest(), "root"
        )
        with pytest.raises(FetchError, match="outside its folder"):
            fetch_dataset("har", tmp_path, archives={"har": archive}, progress=False)
    finally:
        server.close()
    assert not (tmp_path.parent / "evil.txt").exists() and not (tmp_path / "root").exists()


def test_an_unreachable_server_is_one_clear_line(tmp_path, har_server, capsys):
    server, _, archive = har_server
    server.close()
    with pytest.raises(FetchError, match="cannot download"):
        download(archive.url, tmp_path / "x.zip", archive.checksum, progress=False, timeout=5)


def test_leaf_data_sets_say_what_to_run_and_embedded_ones_need_nothing(tmp_path, capsys):
    assert main(["data", "fetch", "femnist", "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "preprocess.sh -s niid" in err and "leaf/data" in err
    assert main(["data", "fetch", "digits", "--data-dir", str(tmp_path)]) == 0
    assert "nothing to fetch" in capsys.readouterr().out
    assert main(["data", "fetch", "cifar10"]) == 1
    assert "needs --data-dir" in capsys.readouterr().err
    assert main(["data", "fetch", "no-such-set", "--data-dir", str(tmp_path)]) == 1
    assert "unknown dataset 'no-such-set'" in capsys.readouterr().err


def test_torchvision_data_sets_are_fetched_by_torchvision_itself(tmp_path, monkeypatch, capsys):
    import torchvision.datasets as tvd

    calls = []

    class FakeCIFAR10:
        def __init__(self, root, train, download):
            calls.append((root, train, download))
            (Path(root) / "cifar-10-batches-py").mkdir(exist_ok=True)

    monkeypatch.setattr(tvd, "CIFAR10", FakeCIFAR10)
    assert main(["data", "fetch", "cifar10", "--data-dir", str(tmp_path)]) == 0
    assert calls == [(str(tmp_path), True, True), (str(tmp_path), False, True)]
    assert "cifar10 fetched into" in capsys.readouterr().out


def test_the_progress_bar_goes_to_stderr_and_stdout_stays_clean(tmp_path, har_server, capsys):
    assert main(["data", "fetch", "har", "--data-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "har.zip" in err and "100%" in err
    assert "%" not in out and out.strip().endswith(f"use --data-dir {tmp_path}")
