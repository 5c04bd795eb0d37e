"""Chats to files and back: JSON (versioned, images embedded) and Markdown (images beside it).

Qt-free. The JSON format, "merlin-chats" version 2 (docs/chat-format.md describes it; version 1
files, without reasoning, still import):

    {"format": "merlin-chats", "version": 2, "exported": "<ISO 8601 time, UTC>",
     "app": "Merlin 0.1.0",
     "conversations": [
        {"title": "...", "created": 1764669600.0, "updated": 1764669700.0,
         "messages": [
            {"role": "user" | "assistant", "text": "...", "state": "done", "stats": {},
             "reasoning": "...",  # a thinking model's answer only; absent otherwise
             "images": [{"name": "cat.jpg", "ext": "jpg", "sha256": "<hex>",
                         "data": "<base64>", "tokens": 1024}]}]}]}

An image's "tokens" (optional) is the image-token budget it was asked with, so a later turn
of the imported chat reads it as it was read then; without it, the settings' default.

In Markdown a thinking model's reasoning is a collapsed `<details>` block above its answer,
quoted line by line, with raw HTML made literal (markdown.literal_html): GitHub shows it
folded and as written, a plain-text reader sees a quote. The answer text never holds it.

A chat with versions (edited questions, regenerated answers: store_tree.py) is exported as the
path it shows, the version selected at each fork, like the window shows it; the other versions
stay in the store only (docs/branches.md). Import makes each chat one linear branch.

Import reads and checks the whole file before it writes anything (format, version, every
field's type and size, every image's bytes against its sha256), then adds all conversations,
shown at once (model/store_import.py): a bad file is refused with a message and never
half-imported, and nothing already in the store is changed. Files are written atomically (a
temporary file, then a rename), so an export interrupted half-way never leaves a truncated
file in the user's place.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from merlin.app.model.markdown import literal_html
from merlin.app.model.store import MESSAGE_STATES, ImageRef, Store
from merlin.app.model.store_schema import clean_stats, image_tokens
from merlin.engine import replace_file
from merlin.engine.tokenizer import clean_text

FORMAT = "merlin-chats"
VERSION = 2  # 2: a thinking answer's "reasoning"; 1 files still import
MAX_FILE_BYTES = 1 << 30  # an export of many chats with pictures stays well under this
MAX_CONVERSATIONS = 100_000
MAX_MESSAGES = 100_000  # per conversation
MAX_TEXT_CHARS = 8 << 20  # per message
MAX_TITLE_CHARS = 1000
MAX_IMAGES = 64  # per message
MAX_SECONDS = 253402300800.0  # 10000-01-01 UTC: a "created" time must be a date before it
_EXT = re.compile(r"^[a-z0-9]{1,8}$")
_SHA = re.compile(r"^[0-9a-f]{64}$")


class ChatFileError(ValueError):
    """The file cannot be imported; the message says why, for the user."""


@dataclass
class ImportedImage:
    name: str
    ext: str
    data: bytes
    tokens: int | None = None  # the image-token budget it was asked with (None: the default)


@dataclass
class ImportedMessage:
    role: str
    text: str
    state: str = "done"
    stats: dict = field(default_factory=dict)
    images: list[ImportedImage] = field(default_factory=list)
    reasoning: str | None = None  # a thinking model's (assistant messages only)
    missing_images: int = 0  # pictures whose file was gone at export ("data": null): left out


@dataclass
class ImportedConversation:
    title: str
    created: float | None
    messages: list[ImportedMessage]


# ---- export ------------------------------------------------------------------------------


@dataclass
class JsonExport:
    """A JSON export as read from the store (rows and the picture files' paths: fast, on the
    store's thread); document() and write() read the pictures, on any thread. A picture whose
    file is gone by then is exported as missing ("data": null), as at export time."""

    conversations: list[dict]  # the document's, each image with its file's "path"

    def document(self) -> dict:
        from merlin.engine.version import __version__

        convs = []
        for conv in self.conversations:
            messages = []
            for m in conv["messages"]:
                images = [_embedded(im) for im in m["images"]]
                messages.append({**m, "images": images})
            convs.append({**conv, "messages": messages})
        return {
            "format": FORMAT,
            "version": VERSION,
            "exported": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "app": f"Merlin {__version__}",
            "conversations": convs,
        }

    def write(self, path: Path | str) -> Path:
        path = Path(path)
        doc = self.document()
        write_atomically(path, json.dumps(doc, ensure_ascii=False, indent=1).encode("utf-8"))
        return path


def _embedded(image: dict) -> dict:
    path = image["path"]
    data = path.read_bytes() if path.is_file() else b""
    out = {
        "name": image["name"],
        "ext": image["ext"],
        "sha256": hashlib.sha256(data).hexdigest() if data else image["sha256"],
        "data": base64.b64encode(data).decode("ascii") if data else None,
    }
    if image.get("tokens") is not None:
        out["tokens"] = image["tokens"]
    return out


def json_export(store: Store, conversation_ids: Sequence[int]) -> JsonExport:
    """The conversations (in the order given) to export: of each, the messages it shows (the
    selected version at each fork)."""
    convs = []
    for cid in conversation_ids:
        row = store.conversation(cid)
        if row is None:
            continue
        messages = []
        for m in store.messages(cid):
            images = [
                {
                    "name": r.name,
                    "ext": r.ext,
                    "sha256": r.sha256,
                    "tokens": r.tokens,
                    "path": store.image_path(r),
                }
                for r in m.images
            ]
            message = {
                "role": m.role,
                "text": m.text,
                "state": m.state,
                "stats": m.stats,
                "images": images,
            }
            if m.reasoning is not None:
                message["reasoning"] = m.reasoning
            messages.append(message)
        convs.append(
            {
                "title": row.title,
                "created": row.created,
                "updated": row.updated,
                "messages": messages,
            }
        )
    return JsonExport(convs)


def export_json(store: Store, conversation_ids: Sequence[int]) -> dict:
    """The conversations as a "merlin-chats" document (json_export, then its pictures)."""
    return json_export(store, conversation_ids).document()


def conversation_markdown(store: Store, conversation_id: int, image_folder: str = "") -> str:
    """One chat as Markdown (its selected path): a heading, then each message under its
    speaker's name. Images are linked as `image_folder/<name>` (what write_markdown puts
    beside the file), or named only when image_folder is empty (copy as Markdown)."""
    row = store.conversation(conversation_id)
    if row is None:
        return ""
    out = [f"# {row.title}", ""]
    for m in store.messages(conversation_id):
        out += [f"## {'You' if m.role == 'user' else 'Merlin'}", ""]
        for name in _image_file_names(m.images):
            out.append(f"![{name}]({image_folder}/{name})" if image_folder else f"[image: {name}]")
        if m.images:
            out.append("")
        if m.reasoning:
            out += reasoning_markdown(m.reasoning, m.stats.get("thinking_s"))
        out += [m.text.rstrip(), ""]
    return "\n".join(out).rstrip() + "\n"


def reasoning_markdown(reasoning: str, seconds=None) -> list[str]:
    """A thinking model's reasoning as Markdown lines: a collapsed <details> block holding it
    quoted, HTML-looking text made literal (it cannot close the block or hide what follows)."""
    label = "Thinking"
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds >= 1:
        label += f" ({int(seconds)} s)"
    quoted = [f"> {line}" if line.strip() else ">" for line in literal_html(reasoning).splitlines()]
    return ["<details>", f"<summary>{label}</summary>", "", *quoted, "", "</details>", ""]


@dataclass
class MarkdownExport:
    """A Markdown export as read from the store (fast, on the store's thread); write() copies
    the pictures into `<stem>_images/` beside the file and writes it, on any thread."""

    path: Path
    text: str
    pictures: list[tuple[Path, str]]  # (the store's file, its name in the pictures' folder)

    def write(self) -> Path:
        folder = self.path.with_name(f"{self.path.stem}_images")
        if self.pictures:
            folder.mkdir(parents=True, exist_ok=True)
        for source, name in self.pictures:
            if source.is_file():
                write_atomically(folder / name, source.read_bytes())
        write_atomically(self.path, self.text.encode("utf-8"))
        return self.path


def markdown_export(store: Store, conversation_id: int, path: Path | str) -> MarkdownExport:
    """The chat to write to `path` (a .md file), its pictures to `<stem>_images/` beside it."""
    path = Path(path)
    if store.conversation(conversation_id) is None:
        raise ChatFileError(f"There is no chat {conversation_id} to export.")
    pictures = [
        (store.image_path(ref), name)
        for m in store.messages(conversation_id)
        for ref, name in zip(m.images, _image_file_names(m.images))
    ]
    folder = path.with_name(f"{path.stem}_images").name
    text = conversation_markdown(store, conversation_id, image_folder=folder)
    return MarkdownExport(path, text, pictures)


def write_markdown(store: Store, conversation_id: int, path: Path | str) -> Path:
    """Write the chat to `path` and its images beside it; returns the Markdown file's path."""
    return markdown_export(store, conversation_id, path).write()


def write_json(store: Store, conversation_ids: Sequence[int], path: Path | str) -> Path:
    return json_export(store, conversation_ids).write(path)


def write_atomically(path: Path, data: bytes) -> None:
    """Write data to path through a temporary file in the same folder and a rename (through a
    symlink to its target, keeping the replaced file's permissions: engine.replace_file)."""
    with replace_file.replacing(path) as f:
        f.write(data)


def _image_file_names(refs: Sequence[ImageRef]) -> list[str]:
    """File names for a message's images: the user's name, made safe and unique by hash."""
    out = []
    for ref in refs:
        stem = re.sub(r"[^\w.-]+", "_", Path(ref.name).stem)[:60] or "image"
        out.append(f"{stem}-{ref.sha256[:8]}.{ref.ext}")
    return out


# ---- import ------------------------------------------------------------------------------


def read_json(path: Path | str) -> list[ImportedConversation]:
    """Read and check a "merlin-chats" file completely; raise ChatFileError with the reason."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as e:
        raise ChatFileError(f"{path} cannot be read ({e.strerror or e}).") from None
    if not path.is_file():
        raise ChatFileError(f"{path} is not a regular file.")
    if st.st_size > MAX_FILE_BYTES:
        raise ChatFileError(
            f"{path} is {st.st_size / 2**20:,.0f} MB; Merlin imports files up to "
            f"{MAX_FILE_BYTES >> 20:,} MB. Export fewer chats at a time."
        )
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        doc = json.loads(raw.decode("utf-8-sig"))  # a BOM, as Windows editors save
    except UnicodeDecodeError:
        raise ChatFileError(f"{path} is not a Merlin chat export (not UTF-8 text).") from None
    except json.JSONDecodeError as e:
        raise ChatFileError(
            f"{path} is not a Merlin chat export, or it is truncated (JSON error at line "
            f"{e.lineno}: {e.msg})."
        ) from None
    except ValueError:  # a number longer than Python reads (its int digit limit)
        raise ChatFileError(
            f"{path} is not a Merlin chat export: it holds a number thousands of digits long. "
            "Choose a file that Merlin exported."
        ) from None
    except (OSError, RecursionError, MemoryError) as e:
        raise ChatFileError(f"{path} cannot be read ({e}).") from None
    return parse_document(doc, str(path))


def parse_document(doc, where: str = "the file") -> list[ImportedConversation]:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ChatFileError(f'{where} is not a Merlin chat export (no "format": "{FORMAT}").')
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ChatFileError(f'{where}: "version" must be a whole number.')
    if version > VERSION:
        raise ChatFileError(
            f"{where} was written by a newer Merlin (format version {version}; this one reads "
            f"up to {VERSION}). Update Merlin to import it."
        )
    if version < 1:  # 1 and 2 read the same; 1 never has "reasoning"
        raise ChatFileError(f"{where}: unknown format version {version}.")
    convs = doc.get("conversations")
    if not isinstance(convs, list):
        raise ChatFileError(f'{where}: "conversations" must be a list.')
    if len(convs) > MAX_CONVERSATIONS:
        raise ChatFileError(f"{where} holds {len(convs):,} chats; at most {MAX_CONVERSATIONS:,}.")
    return [_conversation(c, f"{where}, chat {i + 1}") for i, c in enumerate(convs)]


def _conversation(c, where: str) -> ImportedConversation:
    if not isinstance(c, dict):
        raise ChatFileError(f"{where}: must be an object.")
    title = _text(c.get("title"), f"{where}: title", MAX_TITLE_CHARS)
    created = c.get("created")
    if created is not None:
        created = _seconds(created, f'{where}: "created"')
    messages = c.get("messages")
    if not isinstance(messages, list):
        raise ChatFileError(f'{where}: "messages" must be a list.')
    if len(messages) > MAX_MESSAGES:
        raise ChatFileError(f"{where}: {len(messages):,} messages; at most {MAX_MESSAGES:,}.")
    return ImportedConversation(
        title=title.strip() or "Imported chat",
        created=created,
        messages=[_message(m, f"{where}, message {j + 1}") for j, m in enumerate(messages)],
    )


def _message(m, where: str) -> ImportedMessage:
    if not isinstance(m, dict):
        raise ChatFileError(f"{where}: must be an object.")
    role = m.get("role")
    if role not in ("user", "assistant"):
        raise ChatFileError(f'{where}: "role" must be "user" or "assistant", not {role!r}.')
    text = _text(m.get("text"), f"{where}: text", MAX_TEXT_CHARS)
    state = m.get("state", "done")
    if state not in MESSAGE_STATES:
        raise ChatFileError(f"{where}: unknown state {state!r}.")
    if state in ("streaming", "queued"):
        state = "interrupted"  # nothing is generating it in this store
    stats = m.get("stats", {})
    if not isinstance(stats, dict):
        raise ChatFileError(f'{where}: "stats" must be an object.')
    stats = clean_stats(stats)  # a figure of the wrong kind is left out, not stored
    images = m.get("images", [])
    if not isinstance(images, list) or len(images) > MAX_IMAGES:
        raise ChatFileError(f'{where}: "images" must be a list of at most {MAX_IMAGES}.')
    reasoning = m.get("reasoning")
    if reasoning is not None:
        reasoning = _text(reasoning, f"{where}: reasoning", MAX_TEXT_CHARS)
        if role != "assistant":
            raise ChatFileError(f"{where}: only an answer can have reasoning.")
    found = [_image(im, f"{where}, image {k + 1}") for k, im in enumerate(images)]
    kept = [im for im in found if im is not None]
    return ImportedMessage(role, text, state, stats, kept, reasoning, len(found) - len(kept))


def _image(im, where: str) -> ImportedImage | None:
    """The picture, or None for one whose file was already gone when it was exported (export
    writes "data": null): the rest of the chat still imports."""
    if not isinstance(im, dict):
        raise ChatFileError(f"{where}: must be an object.")
    name = _text(im.get("name", "image"), f"{where}: name", 255)
    ext = im.get("ext")
    if not isinstance(ext, str) or not _EXT.match(ext):
        raise ChatFileError(f'{where}: "ext" must be a short file extension like "png".')
    sha = im.get("sha256")
    if not isinstance(sha, str) or not _SHA.match(sha):
        raise ChatFileError(f'{where}: "sha256" must be 64 hexadecimal digits.')
    tokens = im.get("tokens")
    if tokens is not None and image_tokens(tokens) is None:
        raise ChatFileError(
            f'{where}: "tokens" must be a whole number of image tokens from 1 to {1 << 20:,}.'
        )
    data = im.get("data")
    if data is None and "data" in im:
        return None
    if not isinstance(data, str):
        raise ChatFileError(f"{where}: the picture's data must be base64 text.")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ChatFileError(f"{where}: the picture's data is not valid base64.") from None
    if hashlib.sha256(raw).hexdigest() != sha:
        raise ChatFileError(f"{where}: the picture's data does not match its sha256 (damaged).")
    return ImportedImage(name, ext, raw, tokens)


def _seconds(value, where: str) -> float:
    """A time in seconds since 1970 as a float: a finite number a date can be made of (up to
    the year 9999), so a crafted huge, infinite or NaN value is refused here, not later."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ChatFileError(f"{where} must be a number of seconds.")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not 0 <= seconds < MAX_SECONDS:  # False for NaN too
        raise ChatFileError(
            f"{where} must be a number of seconds since 1970 (a date before the year 10000)."
        )
    return seconds


def _text(value, where: str, limit: int) -> str:
    """A text field; a lone surrogate (an escape like \\ud800 that is no character, which the
    database cannot store) becomes U+FFFD (tokenizer.clean_text, as typed text)."""
    if not isinstance(value, str):
        raise ChatFileError(f"{where} must be text.")
    if len(value) > limit:
        raise ChatFileError(f"{where} is {len(value):,} characters; at most {limit:,}.")
    return clean_text(value)


def store_images(store: Store, convs: Sequence[ImportedConversation]) -> list:
    """Write the checked conversations' images into the store (content-addressed files, no
    rows: any thread; Store.import_image_bytes) and return what Store.add_conversations
    takes. Harmless if nothing is added after: the store's image collection removes files no
    message refers to."""
    prepared = []
    for conv in convs:
        messages = []
        for m in conv.messages:
            refs = [
                replace(store.import_image_bytes(im.data, im.ext, im.name), tokens=im.tokens)
                for im in m.images
            ]
            messages.append((m.role, m.text, m.state, m.stats, refs, m.reasoning))
        prepared.append((conv.title, conv.created, messages))
    return prepared


def copy_conversations(source: Store, target: Store) -> dict[int, int]:
    """Every chat of source added to target (a new chat history taking the chats a window
    kept in memory): the path each shows, its pictures (one whose file is gone left out),
    message states as they are (a message waiting for the model stays waiting), each chat's
    thinking switch, the list's order; all or nothing. {source id: target id}."""
    rows = list(reversed(source.conversations()))  # oldest first: the newest gets the last id
    convs = []
    for row in rows:
        messages = []
        for m in source.messages(row.id):
            images = []
            for ref in m.images:
                try:
                    data = source.image_path(ref).read_bytes()
                except OSError:
                    continue
                images.append(ImportedImage(ref.name, ref.ext, data, ref.tokens))
            messages.append(ImportedMessage(m.role, m.text, m.state, m.stats, images, m.reasoning))
        convs.append(ImportedConversation(row.title, row.created or None, messages))
    new_ids = import_conversations(target, convs) if convs else []
    for row, new_id in zip(rows, new_ids):
        if source.thinking(row.id) is not None:
            target.set_thinking(new_id, source.thinking(row.id))
    return {row.id: new_id for row, new_id in zip(rows, new_ids)}


def import_conversations(store: Store, convs: Sequence[ImportedConversation]) -> list[int]:
    """Add the checked conversations to the store, all or nothing (Store.add_conversations),
    their images written first (store_images); returns their ids."""
    return store.add_conversations(store_images(store, convs))
