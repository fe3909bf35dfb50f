"""``pflarena data fetch``: archives and torchvision's files downloaded from a loopback HTTP
server (no network), checked against their checksum, continued after a cut with an HTTP
Range request, and never left half-written where a loader reads; without network, one line
naming the data set, the URL and ``--from``, and nothing left behind; ``--from`` installing
from local copies; LEAF's data sets answered with what to run."""

from __future__ import annotations

import gzip
import hashlib
import io
import struct
import threading
import urllib.error
import urllib.request
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from fake_data import write_fake_femnist

from pflarena.cli import main
from pflarena.core.datasets import check_files, har_paths
from pflarena.core.datasets.base import DatasetError
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


def test_the_progress_bar_goes_to_stderr_and_stdout_stays_clean(tmp_path, har_server, capsys):
    assert main(["data", "fetch", "har", "--data-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "har.zip" in err and "100%" in err
    assert "%" not in out and out.strip().endswith(f"use --data-dir {tmp_path}")


# Torchvision's data sets, offline errors and --from.


def _idx(array: np.ndarray) -> bytes:
    """An IDX file (MNIST's format) of ``uint8`` values."""
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.asarray(array, dtype=np.uint8).tobytes()


def _fake_mnist_files() -> dict[str, bytes]:
    """MNIST's four download files in small: 6 train and 4 test images."""
    rng = np.random.default_rng(0)
    files = {}
    for prefix, count in (("train", 6), ("t10k", 4)):
        images = rng.integers(0, 256, (count, 28, 28))
        files[f"{prefix}-images-idx3-ubyte.gz"] = gzip.compress(_idx(images))
        files[f"{prefix}-labels-idx1-ubyte.gz"] = gzip.compress(_idx(np.arange(count) % 10))
    return files


@pytest.fixture
def fake_mnist(monkeypatch):
    """torchvision's MNIST declaring the small files' MD5s, a first mirror that refuses
    connections and a loopback server as the second."""
    import torchvision.datasets as tvd

    files = _fake_mnist_files()
    server = _Server({f"/mnist/{name}": body for name, body in files.items()})
    md5s = [(name, hashlib.md5(body).hexdigest()) for name, body in files.items()]
    monkeypatch.setattr(tvd.MNIST, "resources", md5s)
    monkeypatch.setattr(tvd.MNIST, "mirrors", ["http://127.0.0.1:1/mnist/", server.url("/mnist/")])
    yield server, files
    server.close()


@pytest.fixture
def no_network(monkeypatch):
    """Every URL fails as it does on a machine without network (no name resolution)."""
    tried = []

    def unreachable(request, *args, **kwargs):
        tried.append(request.full_url)
        raise urllib.error.URLError(OSError(-2, "Name or service not known"))

    monkeypatch.setattr(urllib.request, "urlopen", unreachable)
    return tried


def _mnist_url() -> str:
    import torchvision.datasets as tvd

    return tvd.MNIST.mirrors[0] + tvd.MNIST.resources[0][0]


@pytest.mark.parametrize("name", ["mnist", "cifar10", "har"])
def test_without_network_a_fetch_is_one_line_and_leaves_nothing_behind(
    name, tmp_path, no_network, capsys
):
    import torchvision.datasets as tvd

    url = {
        "mnist": _mnist_url(),
        "cifar10": tvd.CIFAR10.url,
        "har": ARCHIVES["har"].url,
    }[name]
    new = tmp_path / "new" / "data"  # neither folder there before
    assert main(["data", "fetch", name, "--data-dir", str(new), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"cannot download {name} from {url}" in err and "Name or service not known" in err
    assert f"pflarena data fetch {name} --data-dir {new} --from PATH" in err
    assert no_network[0] == url
    assert not (tmp_path / "new").exists()  # the folders it created are gone

    # A folder that was there keeps what it held, and only that.
    kept = tmp_path / "kept"
    (kept / "MNIST").mkdir(parents=True)  # e.g. another copy's folder
    (kept / "notes.txt").write_text("mine")
    before = sorted(p.relative_to(kept) for p in kept.rglob("*"))
    assert main(["data", "fetch", name, "--data-dir", str(kept), "--quiet"]) == 1
    assert sorted(p.relative_to(kept) for p in kept.rglob("*")) == before
    assert (kept / "notes.txt").read_text() == "mine"


def test_the_mnist_mirrors_are_named_and_an_empty_folder_is_not_a_data_set(
    tmp_path, no_network, capsys
):
    """An empty MNIST/raw (what a failed fetch used to leave) is not the data set: the next
    fetch tries again instead of saying it is already there."""
    (tmp_path / "MNIST" / "raw").mkdir(parents=True)
    with pytest.raises(DatasetError, match="lacks train-images-idx3-ubyte"):
        check_files("mnist", tmp_path)
    assert main(["data", "fetch", "mnist", "--data-dir", str(tmp_path), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "nor from its mirror http://yann.lecun.com/exdb/mnist/" in err
    assert "a folder holding train-images-idx3-ubyte.gz" in err and "mnist-70k.npz" in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["MNIST", "raw"]


def test_mnist_is_fetched_from_a_mirror_and_laid_out_by_torchvision(tmp_path, fake_mnist, capsys):
    server, files = fake_mnist
    assert main(["data", "fetch", "mnist", "--data-dir", str(tmp_path), "--quiet"]) == 0
    assert f"mnist fetched into {tmp_path}" in capsys.readouterr().out
    assert len(server.ranges) == len(files)  # each file once, from the second mirror
    raw = tmp_path / "MNIST" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == sorted(
        [*files, *(name.removesuffix(".gz") for name in files)]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["MNIST"]  # nothing staged is left
    assert main(["data", "mnist", "--check", "--data-dir", str(tmp_path)]) == 0
    assert "mnist: 10 samples in one pool" in capsys.readouterr().out


def test_from_a_folder_installs_torchvision_files_without_network(
    tmp_path, fake_mnist, no_network, capsys
):
    _, files = fake_mnist
    copy = tmp_path / "copy" / "MNIST" / "raw"  # the folder found below the one given
    copy.mkdir(parents=True)
    for name, body in files.items():
        (copy / name).write_bytes(body)
    data = tmp_path / "data"
    code = main(
        ["data", "fetch", "mnist", "--data-dir", str(data), "--from", str(tmp_path / "copy")]
    )
    assert code == 0 and not no_network
    assert f"mnist installed into {data} from {tmp_path / 'copy'}" in capsys.readouterr().out
    check_files("mnist", data)
    assert sorted(p.name for p in copy.iterdir()) == sorted(files)  # the copy is untouched


def test_from_refuses_a_file_that_is_not_torchvisions_and_installs_nothing(
    tmp_path, fake_mnist, no_network, capsys
):
    _, files = fake_mnist
    copy = tmp_path / "copy"
    copy.mkdir()
    for name, body in files.items():
        (copy / name).write_bytes(body)
    (copy / "t10k-labels-idx1-ubyte.gz").write_bytes(b"not it")
    data = tmp_path / "data"
    assert main(["data", "fetch", "mnist", "--data-dir", str(data), "--from", str(copy)]) == 1
    err = capsys.readouterr().err
    assert "t10k-labels-idx1-ubyte.gz is not torchvision's" in err and "md5" in err
    assert len(err.strip().splitlines()) == 1 and not data.exists()
    (copy / "t10k-labels-idx1-ubyte.gz").unlink()
    assert main(["data", "fetch", "mnist", "--data-dir", str(data), "--from", str(copy)]) == 1
    assert "missing: t10k-labels-idx1-ubyte.gz" in capsys.readouterr().err and not data.exists()
    assert (
        main(["data", "fetch", "mnist", "--data-dir", str(data), "--from", str(tmp_path / "x")])
        == 1
    )
    assert f"--from {tmp_path / 'x'}: no such file or folder" in capsys.readouterr().err


def test_from_a_single_file_copy(tmp_path, no_network, capsys):
    path = tmp_path / "mnist-70k.npz"
    np.savez(path, x=np.zeros((5, 28, 28), np.uint8), y=np.arange(5))
    data = tmp_path / "data"
    assert main(["data", "fetch", "mnist", "--data-dir", str(data), "--from", str(path)]) == 0
    assert (data / "mnist" / "mnist-70k.npz").read_bytes() == path.read_bytes()
    np.savez(path, x=np.zeros((5, 3)), y=[1])  # not MNIST's arrays
    other = tmp_path / "other"
    assert main(["data", "fetch", "mnist", "--data-dir", str(other), "--from", str(path)]) == 1
    assert "expected x of shape (N, 28, 28)" in capsys.readouterr().err and not other.exists()


def test_from_an_archive_checks_its_checksum_and_keeps_it(tmp_path, har_server, no_network):
    _, body, archive = har_server
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / archive.filename).write_bytes(body)
    data = tmp_path / "data"
    assert main(["data", "fetch", "har", "--data-dir", str(data), "--from", str(downloads)]) == 0
    check_files("har", data)
    assert (downloads / archive.filename).read_bytes() == body  # the copy is not consumed
    assert sorted(p.name for p in data.iterdir()) == ["UCI HAR Dataset"]
    (downloads / archive.filename).write_bytes(body[:-1] + b"x")
    with pytest.raises(FetchError, match="is not har's archive"):
        fetch_dataset("har", tmp_path / "data2", source=downloads / archive.filename)
    assert not (tmp_path / "data2").exists()


def test_from_leafs_data_folder(tmp_path, capsys):
    leaf = tmp_path / "leaf" / "data"
    write_fake_femnist(leaf)
    data = tmp_path / "data"
    assert main(["data", "fetch", "femnist", "--data-dir", str(data), "--from", str(leaf)]) == 0
    check_files("femnist", data)
    assert sorted(p.name for p in data.iterdir()) == ["femnist"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (
        main(["data", "fetch", "femnist", "--data-dir", str(tmp_path / "d2"), "--from", str(empty)])
        == 1
    )
    assert "holds no LEAF femnist JSON folders" in capsys.readouterr().err
    assert not (tmp_path / "d2").exists()


def test_data_fetch_help_is_its_own(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["data", "fetch", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: pflarena data fetch NAME --data-dir DIR [--from PATH]")
    assert "--from PATH" in out and "--check" not in out and "Without network" in out
    with pytest.raises(SystemExit):
        main(["data", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: pflarena data [NAME]") and "--check" in out
    assert main(["data", "mnist", "--from", "x"]) == 2
    assert "--from belongs to pflarena data fetch" in capsys.readouterr().err
