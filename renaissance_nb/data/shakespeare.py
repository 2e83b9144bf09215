"""tiny-shakespeare from its published file (char-rnn's ``input.txt``), downloaded and checksummed.

The package ships the same text (data/corpus.py); this loader is for users who keep their data in
a folder of their own or want the file itself. The download goes to a temp file beside its
destination, is checked against the SHA-256 of the published file and only then renamed into
place, so ``root`` never holds a partial or corrupt copy. A file already there is checked too
(hashing 1 MB costs milliseconds), so a stray ``input.txt`` is never read as Shakespeare.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import DataError, DownloadError, bad_argument
from .arrays import DataSplits, check_flag, check_path
from .download import check_timeout, check_writable, download_folder, fetch, fetch_or_why, file_digest, unreadable
from .text import check_context, check_val_fraction, tokens

#: The folder holding char-rnn's copy (the file nanoGPT's shakespeare_char also downloads).
DEFAULT_TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
TINY_SHAKESPEARE_FILE = "input.txt"
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TINY_SHAKESPEARE_CHARS = 1_115_394
_NAME = "tiny-shakespeare"

_fetch = fetch


def _is_file(path: Path, root: Path, where: str) -> bool:
    try:
        return path.is_file()
    except OSError as exc:  # a folder on the way that this user may not enter
        raise unreadable(where, root, exc) from None


def download_tiny_shakespeare(root: str | os.PathLike[str], *, base_url: str = DEFAULT_TINY_SHAKESPEARE_URL,
                              timeout: float = 30, progress: bool = True) -> Path:
    """Make sure ``root/input.txt`` is the tiny-shakespeare text; download it if missing. Returns its path.

    The file ``base_url + "input.txt"`` is fetched into a temp file in ``root``, checked against
    TINY_SHAKESPEARE_SHA256 and only then renamed into place (a mismatch deletes it: DownloadError).
    """
    where = "download_tiny_shakespeare"
    root = check_path(root, where, "root", "~/data/tinyshakespeare").expanduser()
    if not isinstance(base_url, str) or not base_url:
        raise bad_argument(DownloadError, where, "base_url", base_url, "a URL string of the folder holding input.txt",
                           f"pass e.g. base_url={DEFAULT_TINY_SHAKESPEARE_URL!r}")
    timeout = check_timeout(where, timeout)
    progress = check_flag(progress, where, "progress")
    dest = root / TINY_SHAKESPEARE_FILE
    if _is_file(dest, root, where):
        verify_tiny_shakespeare(dest)
        return dest
    with download_folder(root, where):
        check_writable(where, root)
        url = (base_url if base_url.endswith("/") else base_url + "/") + TINY_SHAKESPEARE_FILE
        if progress:
            print(f"tiny-shakespeare: downloading {url} ...", file=sys.stderr, flush=True)
        tmp, why = fetch_or_why(url, root, timeout, _fetch)
        if tmp is None:
            raise DownloadError(f"{where}: could not download {url}: {why}. Fix: check the network or base_url, "
                                f"or put the file there yourself as {dest}.")
        actual = file_digest(tmp)
        if actual != TINY_SHAKESPEARE_SHA256:
            tmp.unlink(missing_ok=True)
            raise DownloadError(f"{where}: {url}: checksum mismatch for {TINY_SHAKESPEARE_FILE}: expected sha256 "
                                f"{TINY_SHAKESPEARE_SHA256}, got {actual}; the download was deleted. Fix: retry "
                                "(the transfer may have been corrupted), or check that base_url serves char-rnn's "
                                "tinyshakespeare/input.txt.")
        os.replace(tmp, dest)
        if progress:
            print(f"tiny-shakespeare: {TINY_SHAKESPEARE_FILE} ok ({dest.stat().st_size:,} bytes, sha256 verified)",
                  file=sys.stderr, flush=True)
    return dest


def verify_tiny_shakespeare(path: Path) -> None:
    """Raise DataError when the file at ``path`` is not the published text (by its SHA-256)."""
    actual = file_digest(path)
    if actual != TINY_SHAKESPEARE_SHA256:
        raise DataError(f"tiny_shakespeare: file {path} has sha256 {actual}, expected {TINY_SHAKESPEARE_SHA256} "
                        "(char-rnn's tinyshakespeare/input.txt). Fix: delete it and call "
                        "tiny_shakespeare(root, download=True), or copy an intact file there.")


def tiny_shakespeare(root: str | os.PathLike[str] = "~/data/tinyshakespeare", download: bool = False,
                     context: int = 128, val_fraction: float = 0.1, timeout: float = 30, *,
                     base_url: str = DEFAULT_TINY_SHAKESPEARE_URL, progress: bool = True) -> DataSplits:
    """tiny-shakespeare (1,115,394 characters) from ``root/input.txt`` as character token windows.

    ``download=True`` fetches the file when it is missing (see :func:`download_tiny_shakespeare`);
    a file already there is checked against the same SHA-256. x and y are int32 (N, context), y
    shifted by one; the last ``val_fraction`` of the text is validation; ``splits.tokenizer`` is
    the 65-character CharTokenizer of the whole text.
    """
    where = "tiny_shakespeare"
    root_p = check_path(root, where, "root", "~/data/tinyshakespeare").expanduser()
    download = check_flag(download, where, "download", "pass download=True to fetch the file, else False")
    c = check_context(context, where)
    f = check_val_fraction(val_fraction, where)
    timeout = check_timeout(where, timeout)
    path = root_p / TINY_SHAKESPEARE_FILE
    if not _is_file(path, root_p, where):
        if not download:
            raise bad_argument(DataError, where, "root", str(root_p),
                               f"a folder holding {TINY_SHAKESPEARE_FILE} (char-rnn's tinyshakespeare); it is missing",
                               "pass download=True to fetch it, point root at a folder that holds it, or use "
                               "datasets.default_text() (the same text, shipped in the package)")
        path = download_tiny_shakespeare(root_p, base_url=base_url, timeout=timeout, progress=progress)
    try:
        verify_tiny_shakespeare(path)  # again after a download: the file read is the file checked
        text = path.read_bytes().decode("utf-8")  # the checksum guarantees ASCII
    except OSError as exc:
        raise unreadable(where, root_p, exc) from None
    return tokens(text, c, val_fraction=f, name=_NAME)


__all__ = ["DEFAULT_TINY_SHAKESPEARE_URL", "TINY_SHAKESPEARE_CHARS", "TINY_SHAKESPEARE_FILE",
           "TINY_SHAKESPEARE_SHA256", "download_tiny_shakespeare", "tiny_shakespeare", "verify_tiny_shakespeare"]
