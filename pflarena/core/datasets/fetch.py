"""Fetching a data set's files into a ``data-dir``: ``pflarena data fetch NAME --data-dir DIR``.

What can be downloaded is:

* the torchvision data sets (``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar100``,
  ``emnist``): through torchvision's own ``download=True``, which checks every file's MD5
  and lays the files out where the loaders (``download=False``) read them;
* ``har`` (UCI HAR) and ``tiny-imagenet``: one archive each, by URL, checked against its
  published checksum, then unpacked (:data:`ARCHIVES`).

LEAF's ``femnist`` and ``shakespeare`` are built by LEAF's own ``preprocess.sh`` from the
raw NIST and Gutenberg sources (sampling, splitting, each with its flags); that is not
copied here: :func:`fetch_dataset` says what to run instead (:class:`FetchError`).

An archive is downloaded by :func:`download` to ``<name>.part`` beside its final place,
continued with an HTTP ``Range`` request when a ``.part`` is there already (a download cut
short resumes where it stopped), checked against its checksum and only then renamed into
place; a checksum that does not match deletes the ``.part`` and leaves nothing in place.
Unpacking goes to a scratch folder renamed into place once complete, so a loader never
reads a half-written file.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import sys
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pflarena.core.datasets.base import DatasetError

__all__ = [
    "ARCHIVES",
    "Archive",
    "FetchError",
    "download",
    "extract_zip",
    "fetch_dataset",
    "file_digest",
]


class FetchError(DatasetError):
    """A data set that could not be fetched; the message says why and what to do."""


@dataclass(frozen=True)
class Archive:
    """One downloadable archive of a data set.

    Parameters
    ----------
    url : str
        Where it is.
    filename : str
        Its name under ``data_dir`` while it is downloaded.
    checksum : str
        ``"<algorithm>:<hex digest>"`` (``sha256`` or ``md5``), as published.
    root : str
        The folder it unpacks to under ``data_dir`` (the loader's layout).
    inner : str
        A zip inside the zip that holds ``root`` (UCI's HAR download wraps one); ``""``: none.
    """

    url: str
    filename: str
    checksum: str
    root: str
    inner: str = ""


#: The archives ``pflarena data fetch`` downloads by URL. The checksums are the published
#: ones: UCI HAR's SHA-256 of UCI's current download (which wraps ``UCI HAR Dataset.zip``),
#: Tiny-ImageNet's MD5, the one torchvision-style loaders of it check.
ARCHIVES: dict[str, Archive] = {
    "har": Archive(
        url="https://archive.ics.uci.edu/static/public/240/"
        "human+activity+recognition+using+smartphones.zip",
        filename="human+activity+recognition+using+smartphones.zip",
        checksum="sha256:c00b803081a5c797cd5e4b83700a9810b38d53d9d84e01917e090e1fdbc81031",
        root="UCI HAR Dataset",
        inner="UCI HAR Dataset.zip",
    ),
    "tiny-imagenet": Archive(
        url="http://cs231n.stanford.edu/tiny-imagenet-200.zip",
        filename="tiny-imagenet-200.zip",
        checksum="md5:90528d7ca1a48142e341f4ef8d21d0de",
        root="tiny-imagenet-200",
    ),
}

_LEAF_STEPS = {
    "femnist": "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample",
    "shakespeare": "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample -tf 0.8",
}


def file_digest(path: Path, algorithm: str) -> str:
    """The hex digest of a file (``sha256``, ``md5``, any :mod:`hashlib` name)."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _split_checksum(checksum: str) -> tuple[str, str]:
    algorithm, _, expected = checksum.partition(":")
    if algorithm not in hashlib.algorithms_available or not expected:
        raise ValueError(f"checksum {checksum!r} is not '<algorithm>:<hex digest>'")
    return algorithm, expected.lower()


def download(
    url: str,
    dest: Path,
    checksum: str,
    *,
    progress: bool = True,
    timeout: float = 60.0,
    chunk_size: int = 1 << 20,
) -> Path:
    """Download ``url`` to ``dest`` and return ``dest``, checked against ``checksum``.

    The bytes go to ``dest.part``; a ``.part`` already there (a download cut short) is
    continued with an HTTP ``Range`` request (from the start again if the server ignores
    it). Once complete, its digest is compared with ``checksum``: a match renames it to
    ``dest`` (atomically: ``dest`` is whole or absent), a mismatch deletes it and raises
    :class:`FetchError`. A ``dest`` already there with the right digest is kept as it is.
    A progress bar (tqdm) goes to stderr.

    torchvision's ``download_url`` is not used for this: it writes into the final file,
    cannot continue a cut download and leaves a corrupt file in place on a bad checksum.
    """
    algorithm, expected = _split_checksum(checksum)
    dest = Path(dest)
    if dest.is_file():
        if file_digest(dest, algorithm) == expected:
            return dest
        dest.unlink()  # not the published file: fetched again below
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    offset = part.stat().st_size if part.is_file() else 0
    headers = {"User-Agent": "pflarena-data-fetch"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        response = urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout
        )
    except urllib.error.HTTPError as error:
        if error.code != 416 or not offset:  # 416: the .part already holds every byte
            raise FetchError(f"cannot download {url}: HTTP {error.code} {error.reason}") from None
        response = None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise FetchError(f"cannot download {url}: {reason}") from None
    if response is not None:
        _receive(response, part, offset, url, progress, chunk_size)
    actual = file_digest(part, algorithm)
    if actual != expected:
        part.unlink()
        raise FetchError(
            f"{url}: checksum mismatch ({algorithm} {actual}, expected {expected}); the "
            f"download was deleted and nothing was put in place at {dest}. Run the same "
            "command again; if it fails the same way, the file on the server has changed"
        )
    os.replace(part, dest)
    return dest


def _receive(response, part: Path, offset: int, url: str, progress: bool, chunk_size: int) -> None:
    from tqdm import tqdm

    with response:
        if offset and response.status != 206:  # the server sent the whole file
            offset = 0
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length and length.isdigit() else None
        try:
            with (
                open(part, "ab" if offset else "wb") as handle,
                tqdm(
                    total=total,
                    initial=offset,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    desc=part.name.removesuffix(".part"),
                    file=sys.stderr,
                    disable=not progress,
                ) as bar,
            ):
                for block in iter(lambda: response.read(chunk_size), b""):
                    handle.write(block)
                    bar.update(len(block))
                handle.flush()
                os.fsync(handle.fileno())
        except (OSError, http.client.HTTPException) as error:  # cut: keep what came
            raise FetchError(
                f"the download of {url} stopped ({error}); {part.stat().st_size} bytes are "
                f"kept in {part}: the same command continues it"
            ) from None
    if total is not None and part.stat().st_size < total:
        raise FetchError(
            f"the download of {url} stopped after {part.stat().st_size} of {total} bytes; "
            f"they are kept in {part}: the same command continues it"
        )


def _safe_members(archive: zipfile.ZipFile, source: str) -> list[zipfile.ZipInfo]:
    members = []
    for info in archive.infolist():
        pure = PurePosixPath(info.filename)
        if pure.is_absolute() or ".." in pure.parts:
            raise FetchError(f"{source} holds a path outside its folder: {info.filename!r}")
        if pure.parts and pure.parts[0] != "__MACOSX":
            members.append(info)
    return members


def extract_zip(path: Path, data_dir: Path, root: str, inner: str = "") -> Path:
    """Unpack the folder ``root`` of the zip ``path`` (of the zip ``inner`` inside it, if
    given) into ``data_dir/root``, through a scratch folder renamed into place when whole;
    an existing ``data_dir/root`` is replaced only then. Returns ``data_dir/root``."""
    target = data_dir / root
    scratch = data_dir / f".{root}.unpacking"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        with zipfile.ZipFile(path) as outer:
            if inner:
                names = [n for n in outer.namelist() if PurePosixPath(n).name == inner]
                if not names:
                    raise FetchError(f"{path} does not hold {inner!r}")
                with outer.open(names[0]) as nested, zipfile.ZipFile(nested) as archive:
                    archive.extractall(scratch, _safe_members(archive, f"{path}:{inner}"))
            else:
                outer.extractall(scratch, _safe_members(outer, str(path)))
        unpacked = scratch / root
        if not unpacked.is_dir():
            raise FetchError(f"{path} holds no folder {root!r}")
        if target.exists():
            shutil.rmtree(target)
        os.replace(unpacked, target)
    except zipfile.BadZipFile as error:
        raise FetchError(f"{path} is not a readable zip ({error})") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def fetch_dataset(
    name: str,
    data_dir: str | Path,
    *,
    progress: bool = True,
    archives: dict[str, Archive] | None = None,
    say: Callable[[str], None] = print,
) -> str:
    """Fetch data set ``name`` into ``data_dir``, so that ``--data-dir data_dir`` reads it;
    return what was done, in one line. Files already there (the data set's own check
    passes) are not fetched again. :class:`FetchError` when it cannot be fetched (LEAF's
    data sets: the message says what to run), or the download failed."""
    from pflarena.core.datasets.registry import dataset_spec

    spec = dataset_spec(name)
    if spec.check is None:
        return f"{name} ships with pflarena: nothing to fetch"
    if not str(data_dir):
        raise FetchError("pflarena data fetch needs --data-dir DIR: the folder to put it in")
    data_dir = Path(data_dir).expanduser()
    try:
        spec.check(data_dir)
    except DatasetError:
        pass
    else:
        return f"{name} is already in {data_dir}: nothing fetched"
    if name in _LEAF_STEPS:
        raise FetchError(
            f"{name} is built by LEAF's own scripts, which download and sample the raw data: "
            "git clone https://github.com/TalwalkarLab/leaf; "
            f"cd leaf/data/{name}; {_LEAF_STEPS[name]}; then pass leaf/data as --data-dir "
            f"(or copy leaf/data/{name} into {data_dir})"
        )
    archive = (archives or ARCHIVES).get(name)
    if archive is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        say(f"downloading {archive.url} to {data_dir}")
        path = download(
            archive.url, data_dir / archive.filename, archive.checksum, progress=progress
        )
        say(f"checksum ok ({archive.checksum.split(':')[0]}); unpacking {archive.root}/")
        extract_zip(path, data_dir, archive.root, archive.inner)
        path.unlink()
    else:
        from pflarena.core.datasets.torchvision_images import download_torchvision

        data_dir.mkdir(parents=True, exist_ok=True)
        say(f"downloading {name} with torchvision into {data_dir}")
        download_torchvision(name, data_dir)
    try:
        spec.check(data_dir)
    except DatasetError as error:
        raise FetchError(f"{name} was fetched but its files are not as expected: {error}") from None
    return f"{name} fetched into {data_dir}: use --data-dir {data_dir}"
