"""A checkpoint's files over HTTP: what the SDK's `get_checkpoint_archive_url` and `download_checkpoint` read.

On Baseten, `/files` lists presigned S3 URLs that the SDK fetches *without* the API key. The local
equivalent is a link back to this server whose query carries an expiry and an HMAC over the file and the
expiry, keyed with a per-process secret: whoever holds it may fetch that one file until it expires. The
files are the checkpoint's directory as the trainer wrote it, less the server's index (`checkpoint.json`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from baseten.loops import CheckpointFile, CheckpointFilesResponse

from loops_nb.errors import TrainerError
from loops_nb.local.bad_request import BadRequest

URL_LIFETIME_SECONDS = 3600
"""How long a file link stays valid (S3 presigned URLs on Loops are similar: an hour)."""
INDEX_FILE = "checkpoint.json"
"""The server's record of a checkpoint (see LocalLoopsState.record_checkpoint); not part of its files."""
FILE_LINK_PREFIX = "/checkpoint-files/"
"""Served without the API key: the signature in the query is the authorisation."""
DOWNLOAD_ROUTE = FILE_LINK_PREFIX + "{checkpoint_id}/{relative_path:path}"


class CheckpointFileLinks:
    """Signs and checks the links that stand in for presigned URLs."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)
        """Per process: links from an earlier server stop working when it restarts, as expired ones would."""

    def _signature(self, checkpoint_id: str, relative_path: str, expires: int) -> str:
        message = f"{checkpoint_id}\n{relative_path}\n{expires}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def url(self, origin: str, checkpoint_id: str, relative_path: str) -> str:
        expires = int(time.time()) + URL_LIFETIME_SECONDS
        signature = self._signature(checkpoint_id, relative_path, expires)
        path = f"{FILE_LINK_PREFIX}{quote(checkpoint_id)}/{quote(relative_path)}"
        return f"{origin}{path}?expires={expires}&signature={signature}"

    def check(self, checkpoint_id: str, relative_path: str, expires: str, signature: str) -> None:
        """Raise `LinkRefused` unless the link was signed by this server and has not expired."""
        if not expires.isdigit():
            raise LinkRefused("the link has no valid expiry; ask get_checkpoint_archive_url for a new one")
        wanted = self._signature(checkpoint_id, relative_path, int(expires))
        if not hmac.compare_digest(wanted, signature):
            raise LinkRefused(
                "the link's signature does not match (it was made by another server process, or altered); "
                "ask get_checkpoint_archive_url for a new one"
            )
        if int(expires) < time.time():
            raise LinkRefused("the link has expired; ask get_checkpoint_archive_url for a new one")


class LinkRefused(TrainerError):
    """A file link that is not valid (answered 403, as S3 answers a bad presigned URL)."""


def files_page(
    links: CheckpointFileLinks,
    origin: str,
    checkpoint_id: str,
    directory: Path,
    page_size: int,
    page_token: int,
) -> CheckpointFilesResponse:
    """One page of the files' links, size and mtime."""
    if page_size < 1 or page_token < 0:
        raise BadRequest(f"page_size must be >= 1 and page_token >= 0, got {page_size} and {page_token}")
    files = sorted(  # relative to the checkpoint, in a stable order
        p.relative_to(directory)
        for p in directory.rglob("*")
        if p.is_file() and p.relative_to(directory).as_posix() != INDEX_FILE
    )
    page = files[page_token : page_token + page_size]
    entries = []
    for relative in page:
        stat = (directory / relative).stat()
        entries.append(
            CheckpointFile(
                url=links.url(origin, checkpoint_id, relative.as_posix()),
                relative_file_name=relative.as_posix(),
                size_bytes=stat.st_size,
                last_modified=datetime.fromtimestamp(stat.st_mtime, UTC),
            )
        )
    following = page_token + page_size
    return CheckpointFilesResponse(
        presigned_urls=entries,
        next_page_token=following if following < len(files) else None,
        total_count=len(files),
    )


def file_in_checkpoint(directory: Path, relative_path: str) -> Path:
    """The file a link names, refusing anything that leads outside the checkpoint or is its index."""
    target = (directory / relative_path).resolve()
    if not target.is_relative_to(directory.resolve()) or not target.is_file() or relative_path == INDEX_FILE:
        raise BadRequest(f"checkpoint has no file {relative_path!r}")
    return target
