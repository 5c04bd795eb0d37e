"""Getting a checkpoint: download a Qwen3-VL folder from the Hugging Face hub, a mirror of it
(HF_ENDPOINT or a URL, e.g. for users in mainland China) or ModelScope, with progress, cancel
and resume. Qt-free; the Get-a-model dialog runs it on a thread of its own.

huggingface_hub does the transfer (it is the hub's own client: redirects, mirrors, tokens,
retries within a transfer); this module picks the files a checkpoint needs, keeps each one's
partial download in `.<name>.part` so that a later try (after a cancel, a lost network or a
restart) asks only for the rest, reports progress over all of them, checks every large file
against the sha256 the hub publishes (a damaged file is removed and the download says so, so
the next try fetches it again) and every file against the size the hub lists (a mirror's
error page in a file's place is refused), and writes into `<models folder>/<name>` so that a
finished folder is a checkpoint Merlin loads. A folder holds a marker file until every file
is in; the download holds an exclusive lock on it (file_lock), so a second Merlin asking for
the same model is told, not let write the same files. The disk's free space is checked
before anything is fetched.

Transfers read 256 KB at a time (huggingface_hub's default is 10 MB: at a slow link's
200 KB/s the progress stood still and a cancel waited 50 s), and a cancel keeps every chunk
already received (the stop comes after a chunk is written).
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from merlin.app.model.file_lock import try_lock
from merlin.app.model.perf_stats import format_bytes

# what a checkpoint folder needs (README: config, weights, tokenizer, template, preprocessor)
WANTED = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)
MARKER = ".merlin-download"  # in a folder being downloaded; removed when it is complete
CHUNK_BYTES = 256 << 10  # read at a time: progress and cancel at least every 256 KB
LISTING_TIMEOUT_S = 30  # a hub or mirror that accepts the connection and never answers
SPARE_BYTES = 256 << 20  # left free on the disk (the chat store lives beside the models)


class DownloadError(Exception):
    """The download did not finish; the message says why and what to do."""


class Cancelled(DownloadError):
    pass


CANCELLED = "The download was cancelled; starting it again resumes it."


@dataclass
class RemoteFile:
    name: str
    size: int
    sha256: str | None  # the hub's LFS hash of large files; None for small git files


@dataclass
class Progress:
    done_bytes: int
    total_bytes: int
    file: str


def wanted(name: str) -> bool:
    return "/" not in name and any(fnmatch.fnmatch(name, p) for p in WANTED)


def hf_endpoint(mirror: str | None = None) -> str:
    """The hub's address: a mirror given by the user, else HF_ENDPOINT, else the hub."""
    return (mirror or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def list_files(repo_id: str, endpoint: str, token: str | None = None) -> list[RemoteFile]:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    try:
        info = HfApi(endpoint=endpoint, token=token).model_info(
            repo_id, files_metadata=True, timeout=LISTING_TIMEOUT_S
        )
    except RepositoryNotFoundError:
        raise DownloadError(f"{repo_id} was not found on {endpoint}.") from None
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 404):
            raise DownloadError(
                f"{repo_id} was not found on {endpoint} (or it needs an access token)."
            ) from None
        raise DownloadError(f"{endpoint} answered with an error ({_short(e)}).") from None
    except OSError as e:
        raise DownloadError(
            f"{endpoint} could not be reached ({_short(e)}). Check the network, or choose a mirror."
        ) from None
    except ValueError:  # reached, but no JSON came back
        raise DownloadError(
            f"{endpoint} answered, but not as the Hugging Face hub does (a web page?). Check the "
            "mirror's address."
        ) from None
    except Exception as e:  # httpx2 transport errors and the like
        raise DownloadError(f"{endpoint} could not be reached ({_short(e)}).") from None
    files = []
    for s in info.siblings or []:
        if not wanted(s.rfilename):
            continue
        lfs = getattr(s, "lfs", None)
        sha = getattr(lfs, "sha256", None) if lfs is not None else None
        size = getattr(lfs, "size", None) if lfs is not None else None
        files.append(RemoteFile(s.rfilename, int(size or s.size or 0), sha))
    names = {f.name for f in files}
    if "config.json" not in names or not any(n.endswith(".safetensors") for n in names):
        raise DownloadError(
            f"{repo_id} on {endpoint} is not a checkpoint folder Merlin can use (it needs "
            "config.json and .safetensors weights)."
        )
    return files


def download_checkpoint(
    repo_id: str,
    models_dir: Path | str,
    endpoint: str | None = None,
    token: str | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Download repo_id into models_dir/<repo name>; returns the folder when complete."""
    endpoint = hf_endpoint(endpoint)
    cancel = cancel or threading.Event()
    files = list_files(repo_id, endpoint, token)
    if cancel.is_set():
        raise Cancelled(CANCELLED)
    target = Path(models_dir) / repo_id.replace("/", "--")
    with _marked(target, f"{endpoint}/{repo_id}", cancel) as marker:
        _check_room(target, files)
        _fetch_all(repo_id, files, target, endpoint, token, on_progress, cancel)
        marker.done = True
    return target


_STOPPING_WAIT_S = 120.0  # a download of this process still stopping (a stalled transfer)
_in_process: dict[Path, threading.Lock] = {}
_in_process_guard = threading.Lock()


@contextlib.contextmanager
def _marked(target: Path, what: str, cancel: threading.Event):
    """target made, with the marker saying what is being downloaded into it, held under an
    exclusive lock for the download (another Merlin's is refused; one of this process that
    is still stopping after a cancel is waited for); the marker is removed if the caller sets
    .done (the lock goes with the file)."""
    with _in_process_guard:
        own = _in_process.setdefault(target.resolve(), threading.Lock())
    deadline = time.monotonic() + _STOPPING_WAIT_S
    while not own.acquire(timeout=0.2):
        if cancel.is_set():
            raise Cancelled(CANCELLED)
        if time.monotonic() > deadline:
            raise DownloadError(
                f"The last download into {target} is still stopping; try again in a minute."
            )
    try:
        try:
            target.mkdir(parents=True, exist_ok=True)
            marker = try_lock(target / MARKER)
            if marker is not None:
                marker.truncate(0)
                marker.write(what + "\n")
                marker.flush()
        except OSError as e:
            raise DownloadError(f"{target} cannot be written ({e.strerror or e}).") from None
        if marker is None:
            raise DownloadError(
                f"Another Merlin is downloading into {target} now; let it finish there."
            )
        held = _Held()
        try:
            yield held
            if held.done:
                (target / MARKER).unlink(missing_ok=True)
        finally:
            marker.close()
    finally:
        own.release()


@dataclass
class _Held:
    done: bool = False  # every file is in: the marker goes


def _check_room(target: Path, files: list[RemoteFile]) -> None:
    """DownloadError unless the disk holds what is still to come, and SPARE_BYTES more."""
    needed = sum(max(0, f.size - _have(target, f)) for f in files)
    try:
        free = shutil.disk_usage(target).free
    except OSError:  # not known: the transfer says so if the disk fills
        return
    if needed and needed + SPARE_BYTES > free:
        raise DownloadError(
            f"The download needs {format_bytes(needed)} more on the disk of {target}, which has "
            f"{format_bytes(free)} free. Free {format_bytes(needed + SPARE_BYTES - free)} and "
            "start it again: what arrived is kept."
        )


def _have(target: Path, f: RemoteFile) -> int:
    """Bytes of f already on disk (the finished file, or its partial download)."""
    for path in (target / f.name, target / f".{f.name}.part"):
        with contextlib.suppress(OSError):
            return path.stat().st_size
    return 0


def _fetch_all(repo_id, files, target, endpoint, token, on_progress, cancel) -> None:
    total = sum(f.size for f in files)
    finished = 0
    for f in files:
        if cancel.is_set():
            raise Cancelled(CANCELLED)
        try:
            _fetch(repo_id, f, target, endpoint, token, finished, total, on_progress, cancel)
        except DownloadError:
            raise
        except Exception as e:
            if cancel.is_set():
                raise Cancelled(CANCELLED) from None
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                raise DownloadError(
                    f"The disk of {target} is full. Free some space and start the download "
                    "again: it resumes where it stopped."
                ) from None
            raise DownloadError(
                f"{f.name} could not be downloaded ({_short(e)}). Try again: the download "
                "resumes where it stopped."
            ) from None
        finished += f.size
        if on_progress:
            on_progress(Progress(finished, total, f.name))


def _fetch(repo_id, f, target, endpoint, token, start, total, on_progress, cancel) -> None:
    """One file into target/<name>, through target/.<name>.part, which a later try resumes
    with a Range request (huggingface_hub's own downloads start over after a failed call)."""
    import huggingface_hub.constants
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    dest = target / f.name
    if dest.is_file() and dest.stat().st_size == f.size:
        return  # finished by an earlier try (checked then)
    part = target / f".{f.name}.part"
    meta = get_hf_file_metadata(
        hf_hub_url(repo_id, f.name, endpoint=endpoint), token=token, endpoint=endpoint
    )
    size = f.size or meta.size  # the listing's: a mirror's error page has a size of its own
    resume = part.stat().st_size if part.is_file() else 0
    if size is not None and resume > size:
        part.unlink()
        resume = 0
    part.touch()  # an empty file of the repository is one too
    if size is None or resume < size:
        with open(part, "ab") as out:
            huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE = CHUNK_BYTES
            http_get(
                meta.location,
                _StopAfterWrite(out, cancel),
                resume_size=resume,
                headers=build_hf_headers(token=token),
                tqdm_class=_progress_class(f.name, start, total, on_progress),
            )
    got = part.stat().st_size
    if size is not None and got != size:
        part.unlink(missing_ok=True)
        raise DownloadError(
            f"{f.name} arrived as {got:,} bytes where {endpoint} lists {size:,} (a web page "
            "instead of the file?); it was removed. Try again later, or choose another mirror."
        )
    if f.name.endswith(".json") and not _is_json(part):
        part.unlink(missing_ok=True)
        raise DownloadError(
            f"{f.name} arrived as something other than JSON (a web page instead of the file?); "
            f"it was removed. Try again later, or choose another mirror than {endpoint}."
        )
    if f.sha256 and _sha256(part) != f.sha256:
        part.unlink(missing_ok=True)
        raise DownloadError(
            f"{f.name} arrived damaged (its sha256 does not match the hub's); it was removed. "
            "Download again to fetch it anew."
        )
    os.replace(part, dest)


def download_from_modelscope(model_id: str, models_dir: Path | str) -> Path:
    """ModelScope's own client, where its package is installed (no progress or cancel)."""
    try:
        from modelscope import snapshot_download  # type: ignore[import-not-found]
    except ImportError:
        raise DownloadError(
            "ModelScope's package is not installed: `pip install modelscope` in Merlin's "
            "environment, or use the Hugging Face hub or a mirror."
        ) from None
    target = Path(models_dir) / model_id.replace("/", "--")
    with _marked(target, f"modelscope/{model_id}", threading.Event()) as marker:
        try:
            folder = snapshot_download(model_id, local_dir=str(target), allow_patterns=list(WANTED))
        except Exception as e:
            raise DownloadError(
                f"ModelScope download of {model_id} failed ({_short(e)})."
            ) from None
        marker.done = True  # its files are in (an earlier hub try's marker goes too)
    return Path(folder)


def is_incomplete(folder: Path) -> bool:
    return (folder / MARKER).exists()


class _StopAfterWrite:
    """The partial file for huggingface_hub's http_get, ending the transfer once a cancel is
    asked for, after the chunk received is written (its progress report comes before the
    write: a stop there lost the chunk)."""

    def __init__(self, out, cancel: threading.Event):
        self._out, self._cancel = out, cancel

    def write(self, chunk: bytes) -> int:
        n = self._out.write(chunk)
        if self._cancel.is_set():
            self._out.flush()
            raise Cancelled(CANCELLED)
        return n

    def __getattr__(self, attr):  # seek, tell, truncate, flush: the file's own
        return getattr(self._out, attr)


def _progress_class(name, start, total, on_progress):
    """A tqdm stand-in for huggingface_hub: reports bytes."""

    class Report:
        def __init__(self, *args, **kwargs):
            self.n = int(kwargs.get("initial") or 0)

        def update(self, n=1):
            self.n += int(n or 0)
            if on_progress:
                on_progress(Progress(start + self.n, total, name))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def close(self):
            pass

        def set_description(self, *a, **k):
            pass

        def refresh(self, *a, **k):
            pass

        def reset(self, total=None):
            self.n = 0

        def __getattr__(self, attr):  # anything else tqdm has: a no-op
            return lambda *a, **k: None

    return Report


def _is_json(path: Path) -> bool:
    """Does the file hold JSON (config, tokenizer, index: a mirror's error page does not)?"""
    try:
        json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return True


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _short(e: Exception) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:200]
