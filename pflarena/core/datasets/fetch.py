"""Fetching a data set's files into a ``data-dir``: ``pflarena data fetch NAME --data-dir DIR``,
or installing them from a local copy: ``... --from PATH``.

What can be downloaded is:

* the torchvision data sets (``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar100``,
  ``emnist``): the files torchvision's ``download=True`` fetches, from its URLs (and
  mirrors), checked against its MD5s, then laid out by torchvision itself, which finds them
  verified and only unpacks them;
* ``har`` (UCI HAR) and ``tiny-imagenet``: one archive each, by URL, checked against its
  published checksum, then unpacked (:data:`ARCHIVES`).

LEAF's ``femnist`` and ``shakespeare`` are built by LEAF's own ``preprocess.sh`` from the
raw NIST and Gutenberg sources (sampling, splitting, each with its flags); that is not
copied here: :func:`fetch_dataset` says what to run instead (:class:`FetchError`).

Without network, ``--from PATH`` installs the same from a copy made elsewhere
(:func:`fetch_dataset`'s ``source``): the files torchvision downloads (or pflarena's
single-file copy, ``mnist-70k.npz``, ``cifar10-jpeg.tar``), the archive of ``har`` or
``tiny-imagenet``, LEAF's JSON folders; each is checked as a download is (MD5, checksum,
the loader's own check) before it is put in place.

Every file is downloaded by :func:`download` to ``<name>.part``, continued with an HTTP
``Range`` request when a ``.part`` is there already (a download cut short resumes where it
stopped), checked against its checksum and only then renamed into place; a checksum that
does not match deletes the ``.part`` and leaves nothing in place. Unpacking goes to a
scratch folder renamed into place once complete, so a loader never reads a half-written
file. A fetch that fails removes what it had made (the folders it created, the files it
put in place); only a cut download's ``.part`` is kept, for the same command to continue.
Nothing that was there before is deleted.
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
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pflarena.core.datasets.base import DatasetError

__all__ = [
    "ARCHIVES",
    "Archive",
    "DownloadError",
    "FetchError",
    "download",
    "extract_zip",
    "fetch_dataset",
    "file_digest",
]


class FetchError(DatasetError):
    """A data set that could not be fetched; the message says why and what to do."""


class DownloadError(FetchError):
    """A URL that could not be reached (no network, no such host, an HTTP error): nothing
    was received. ``url`` and ``reason`` say which and why."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot download {url}: {reason}")
        self.url, self.reason = url, reason


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
            raise DownloadError(url, f"HTTP {error.code} {error.reason}") from None
        response = None
    except (urllib.error.URLError, OSError) as error:
        raise DownloadError(url, str(getattr(error, "reason", error))) from None
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


@contextmanager
def _undone_on_failure(data_dir: Path, entries: Iterable[str]) -> Iterator[None]:
    """Undo what the body made if it raises: each of ``data_dir``'s ``entries`` (names of
    what the fetch writes there) that was not there before is removed, and so is
    ``data_dir`` itself, with the folders above it, where this fetch created them and they
    are left empty (a cut download's ``.part`` keeps its folder). What was there before is
    never touched."""
    data_dir = data_dir.absolute()
    created = [folder for folder in (data_dir, *data_dir.parents) if not folder.exists()]
    new = [data_dir / entry for entry in dict.fromkeys(entries) if not (data_dir / entry).exists()]
    try:
        yield
    except BaseException:
        for path in new:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            elif path.exists() or path.is_symlink():
                path.unlink(missing_ok=True)
        for folder in created:  # deepest first
            try:
                folder.rmdir()
            except OSError:  # not empty (a .part kept for the next try), or gone
                break
        raise


def _top(relative: str | Path) -> str:
    """The first component of a path relative to ``data_dir`` (what is created there)."""
    return Path(relative).parts[0]


def _find(source: Path, filename: str, folder: str = "") -> Path | None:
    """``source`` itself when it is the file ``filename``; in a folder: ``filename`` in it,
    in its ``folder``, else the first file of that name below it."""
    if source.is_file():
        return source if source.name == filename else None
    for candidate in (source / filename, source / folder / filename):
        if candidate.is_file():
            return candidate
    return next((path for path in sorted(source.rglob(filename)) if path.is_file()), None)


def _copy_in(path: Path, dest: Path) -> None:
    """Copy ``path`` to ``dest`` through ``dest.part``: ``dest`` is whole or absent."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    try:
        shutil.copyfile(path, part)
        os.replace(part, dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def _check_digest(path: Path, checksum: str, what: str) -> None:
    algorithm, expected = _split_checksum(checksum)
    actual = file_digest(path, algorithm)
    if actual != expected:
        raise FetchError(
            f"{path} is not {what}: its {algorithm} is {actual}, expected {expected}; "
            "nothing was installed"
        )


def _offline_route(name: str, data_dir: Path, what: str) -> str:
    """The ``--from`` command that installs ``name`` without network, in one sentence."""
    return (
        f"Offline, install it from a copy: pflarena data fetch {name} --data-dir {data_dir} "
        f"--from PATH (PATH: {what})"
    )


def _torchvision_what(name: str) -> str:
    """What ``--from`` takes for a torchvision data set, in words."""
    from pflarena.core.datasets.torchvision_images import (
        torchvision_resources,
        torchvision_source,
    )

    files = [resource.filename for resource in torchvision_resources(name)]
    if len(files) == 1:
        what = f"the file {files[0]} or a folder holding it"
    else:
        what = f"a folder holding {', '.join(files[:-1])} and {files[-1]}"
    offline = torchvision_source(name).offline
    return what + (f"; or the single file {offline.name}" if offline is not None else "")


def _fetch_torchvision(name: str, data_dir: Path, progress: bool, say: Callable) -> None:
    """Download the files torchvision's ``download=True`` would, then have it unpack them."""
    from pflarena.core.datasets.torchvision_images import (
        torchvision_resources,
        unpack_torchvision,
    )

    say(f"downloading {name} (torchvision's files) into {data_dir}")
    for resource in torchvision_resources(name):
        dest = data_dir / resource.folder / resource.filename
        if dest.is_file() and file_digest(dest, "md5") == resource.md5:
            continue
        staged = data_dir / f".{name}-{resource.filename}"  # its .part: a cut download's
        errors: list[DownloadError] = []
        for url in resource.urls:
            try:
                download(url, staged, f"md5:{resource.md5}", progress=progress)
            except DownloadError as error:  # the next mirror, if any
                errors.append(error)
                continue
            break
        else:
            first = errors[0]
            mirrors = "".join(
                f", nor from its mirror {e.url}"
                + (f" ({e.reason})" if e.reason != first.reason else "")
                for e in errors[1:]
            )
            raise FetchError(
                f"cannot download {name} from {first.url} ({first.reason}){mirrors}: nothing "
                f"of it was kept in {data_dir}. "
                f"{_offline_route(name, data_dir, _torchvision_what(name))}"
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, dest)
    unpack_torchvision(name, data_dir)


def _install_torchvision(name: str, data_dir: Path, source: Path, say: Callable) -> None:
    """``--from``: torchvision's download files (MD5-checked, then unpacked by torchvision),
    else pflarena's single-file copy of the data set (checked by reading it)."""
    from pflarena.core.datasets.torchvision_images import (
        torchvision_resources,
        torchvision_source,
        unpack_torchvision,
    )

    resources = torchvision_resources(name)
    found = {
        resource.filename: _find(source, resource.filename, resource.folder)
        for resource in resources
    }
    offline = torchvision_source(name).offline
    if all(found.values()):
        say(f"installing {name} into {data_dir} from {source} (torchvision's files)")
        for resource in resources:
            path = found[resource.filename]
            _check_digest(path, f"md5:{resource.md5}", f"torchvision's {resource.filename}")
            dest = data_dir / resource.folder / resource.filename
            if not (dest.exists() and dest.samefile(path)):
                _copy_in(path, dest)
        unpack_torchvision(name, data_dir)
        return
    single = _find(source, offline.name, offline.parent.as_posix()) if offline else None
    if single is not None:
        say(f"installing {name} into {data_dir} from {single}")
        _check_single_file(name, single)
        _copy_in(single, data_dir / offline)
        return
    missing = [filename for filename, path in found.items() if path is None]
    raise FetchError(
        f"{source} does not hold what {name} is installed from: {_torchvision_what(name)}; "
        f"missing: {', '.join(missing)}; nothing was installed"
    )


def _check_single_file(name: str, path: Path) -> None:
    """Check pflarena's single-file copy of ``name`` before it is put in place: MNIST's
    arrays are read; CIFAR-10's tar is opened and its first image's path checked."""
    import tarfile

    from pflarena.core.datasets.io import read_mnist_npz

    if name == "mnist":
        try:
            read_mnist_npz(path)
        except DatasetError as error:
            raise FetchError(f"{error}; nothing was installed") from None
        return
    try:
        with tarfile.open(path) as archive:
            first = next((member for member in archive if member.isfile()), None)
    except (tarfile.TarError, OSError) as error:
        raise FetchError(f"{path} is not a readable tar ({error}); nothing was installed") from None
    parts = PurePosixPath(first.name).parts if first is not None else ()
    if len(parts) < 3 or parts[-3] not in ("train", "test") or not parts[-1].endswith(".jpg"):
        raise FetchError(
            f"{path} does not hold train/<class>/*.jpg and test/<class>/*.jpg (first entry: "
            f"{first.name if first is not None else 'none'}); nothing was installed"
        )


def _install_leaf(name: str, data_dir: Path, source: Path, say: Callable) -> None:
    """``--from``: LEAF's JSON folders (``train/`` and ``test/``, or ``all_data/``), from
    LEAF's ``data/`` folder, its ``<name>/`` or its ``<name>/data/``, copied to
    ``data_dir/<name>/data/`` once the loader's own check passes on them."""
    from pflarena.core.datasets.leaf import check_leaf_files

    roots = [source / name / "data", source / "data", source]
    root = next(
        (
            folder
            for folder in roots
            if any((folder / part).is_dir() for part in ("train", "test", "all_data"))
        ),
        None,
    )
    if root is None:
        raise FetchError(
            f"{source} holds no LEAF {name} JSON folders (train/ and test/, or all_data/, in "
            f"it, in {name}/data/ or in data/); nothing was installed"
        )
    scratch = data_dir / f".{name}.installing"
    try:
        parts = [part for part in ("train", "test", "all_data") if (root / part).is_dir()]
        for part in parts:
            shutil.copytree(root / part, scratch / name / "data" / part)
        try:
            check_leaf_files(name, scratch)
        except DatasetError as error:
            raise FetchError(f"{root}: {error}; nothing was installed") from None
        target = data_dir / name / "data"
        if target.exists():
            raise FetchError(
                f"{target} is there already, but does not hold {name} as its loader reads "
                "it; nothing was installed (move it away to install this copy)"
            )
        say(f"installing {name} into {data_dir} from {root}")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(scratch / name / "data", target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def fetch_dataset(
    name: str,
    data_dir: str | Path,
    *,
    source: str | Path | None = None,
    progress: bool = True,
    archives: dict[str, Archive] | None = None,
    say: Callable[[str], None] = print,
) -> str:
    """Fetch data set ``name`` into ``data_dir``, so that ``--data-dir data_dir`` reads it;
    return what was done, in one line. Files already there (the data set's own check
    passes) are not fetched again. With ``source`` (``--from``): install it from that local
    copy instead of the network. :class:`FetchError` when it cannot be fetched (LEAF's data
    sets without ``source``: the message says what to run), or the download failed (one
    line: the URL, why, and the ``--from`` route); a failed fetch leaves nothing of its
    own behind but a cut download's ``.part``."""
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
    if source is not None:
        source = Path(source).expanduser()
        if not source.exists():
            raise FetchError(f"--from {source}: no such file or folder")
    archive = (archives or ARCHIVES).get(name)
    if name in _LEAF_STEPS:
        if source is None:
            raise FetchError(
                f"{name} is built by LEAF's own scripts, which download and sample the raw "
                "data: git clone https://github.com/TalwalkarLab/leaf; "
                f"cd leaf/data/{name}; {_LEAF_STEPS[name]}; then pass leaf/data as --data-dir "
                f"(or install it: pflarena data fetch {name} --data-dir {data_dir} --from "
                "leaf/data)"
            )
        with _undone_on_failure(data_dir, [name, f".{name}.installing"]):
            _install_leaf(name, data_dir, source, say)
    elif archive is not None:
        entries = [archive.root, f".{archive.root}.unpacking", archive.filename]
        with _undone_on_failure(data_dir, entries):
            _fetch_archive(name, archive, data_dir, source, progress, say)
    else:
        from pflarena.core.datasets.torchvision_images import (
            torchvision_resources,
            torchvision_source,
        )

        tv = torchvision_source(name)
        entries = [_top(tv.layout)]
        entries += [_top(r.folder or r.filename) for r in torchvision_resources(name)]
        entries += [f".{name}-{r.filename}" for r in torchvision_resources(name)]
        if tv.offline is not None:
            entries.append(_top(tv.offline))
        with _undone_on_failure(data_dir, entries):
            if source is None:
                _fetch_torchvision(name, data_dir, progress, say)
            else:
                _install_torchvision(name, data_dir, source, say)
    try:
        spec.check(data_dir)
    except DatasetError as error:
        raise FetchError(f"{name} was fetched but its files are not as expected: {error}") from None
    origin = f" from {source}" if source is not None else ""
    return f"{name} {'installed' if source is not None else 'fetched'} into {data_dir}{origin}: use --data-dir {data_dir}"


def _fetch_archive(
    name: str,
    archive: Archive,
    data_dir: Path,
    source: Path | None,
    progress: bool,
    say: Callable[[str], None],
) -> None:
    """Download (or, with ``source``, find there) ``archive``, check its checksum, unpack it."""
    what = f"the archive {archive.filename} or a folder holding it"
    if source is not None:
        path = source if source.is_file() else _find(source, archive.filename)
        if path is None:
            raise FetchError(f"{source} does not hold {archive.filename}; nothing was installed")
        _check_digest(path, archive.checksum, f"{name}'s archive {archive.filename}")
        say(
            f"checksum ok ({archive.checksum.split(':')[0]}); unpacking {archive.root}/ from {path}"
        )
        extract_zip(path, data_dir, archive.root, archive.inner)
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    say(f"downloading {archive.url} to {data_dir}")
    try:
        path = download(
            archive.url, data_dir / archive.filename, archive.checksum, progress=progress
        )
    except DownloadError as error:
        raise FetchError(
            f"cannot download {name} from {error.url} ({error.reason}): nothing of it was "
            f"kept in {data_dir}. {_offline_route(name, data_dir, what)}"
        ) from None
    say(f"checksum ok ({archive.checksum.split(':')[0]}); unpacking {archive.root}/")
    extract_zip(path, data_dir, archive.root, archive.inner)
    path.unlink()
