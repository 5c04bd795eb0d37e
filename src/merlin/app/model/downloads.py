"""Getting a checkpoint: download a Qwen3-VL folder from the Hugging Face hub, a mirror of it
(HF_ENDPOINT or a URL, e.g. for users in mainland China) or ModelScope, with progress, cancel
and resume. Qt-free; the Get-a-model dialog runs it on a thread of its own.

huggingface_hub does the transfer (it is the hub's own client: redirects, mirrors, tokens,
retries within a transfer); this module picks the files a checkpoint needs, keeps each one's
partial download in `.<name>.part` so that a later try (after a cancel, a lost network or a
restart) asks only for the rest, reports progress over all of them, checks every large file
against the sha256 the hub publishes (a damaged file is removed and the download says so, so
the next try fetches it again), and writes into `<models folder>/<name>` so that a finished
folder is a checkpoint Merlin loads. A folder holds a marker file until every file is in.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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
        info = HfApi(endpoint=endpoint, token=token).model_info(repo_id, files_metadata=True)
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
    target = Path(models_dir) / repo_id.replace("/", "--")
    try:
        target.mkdir(parents=True, exist_ok=True)
        (target / MARKER).write_text(f"{endpoint}/{repo_id}\n", encoding="utf-8")
    except OSError as e:
        raise DownloadError(f"{target} cannot be written ({e.strerror or e}).") from None
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
            raise DownloadError(
                f"{f.name} could not be downloaded ({_short(e)}). Try again: the download "
                "resumes where it stopped."
            ) from None
        finished += f.size
        if on_progress:
            on_progress(Progress(finished, total, f.name))
    with contextlib.suppress(OSError):
        (target / MARKER).unlink()
    return target


def _fetch(repo_id, f, target, endpoint, token, start, total, on_progress, cancel) -> None:
    """One file into target/<name>, through target/.<name>.part, which a later try resumes
    with a Range request (huggingface_hub's own downloads start over after a failed call)."""
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
    size = meta.size if meta.size is not None else f.size
    resume = part.stat().st_size if part.is_file() else 0
    if resume > size:
        part.unlink()
        resume = 0
    with open(part, "ab") as out:
        http_get(
            meta.location,
            out,
            resume_size=resume,
            headers=build_hf_headers(token=token),
            expected_size=size,
            tqdm_class=_progress_class(f.name, start, total, on_progress, cancel),
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
    try:
        folder = snapshot_download(model_id, local_dir=str(target), allow_patterns=list(WANTED))
    except Exception as e:
        raise DownloadError(f"ModelScope download of {model_id} failed ({_short(e)}).") from None
    return Path(folder)


def is_incomplete(folder: Path) -> bool:
    return (folder / MARKER).exists()


def _progress_class(name, start, total, on_progress, cancel):
    """A tqdm stand-in for huggingface_hub: reports bytes and stops the transfer on cancel."""

    class Report:
        def __init__(self, *args, **kwargs):
            self.n = int(kwargs.get("initial") or 0)

        def update(self, n=1):
            if cancel.is_set():
                raise Cancelled(CANCELLED)
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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _short(e: Exception) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:200]
