"""The disk tier: finished KV pages kept in a folder, so a restarted process reads a long prefix instead of
recomputing it.

One file per page, named by the chain hash under a folder named by the model's identity:

    DIR/<identity[:24]>/<chain hash, 16 hex>.kvpage
        MAGIC | header length (u32) | header (JSON: version, identity, page size, dtype, shapes,
        chain hash, previous hash, token ids, payload length, blake2b of payload) | payload (K then V, per layer)

Writes run on a background thread from a bounded queue (a full queue drops the write: the hot path never
waits) into a temporary file that os.replace() renames into place, so two processes never see or make half a
file. Reads check every header field, the token ids and the checksum; a file that fails is skipped with a log
line and deleted. The folder is capped in bytes: the least recently used pages (by modification time, which a
read refreshes) go first.
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import json
import logging
import os
import queue
import struct
import threading
import time
import uuid
import weakref
from collections.abc import Sequence
from pathlib import Path

import torch

log = logging.getLogger(__name__)

MAGIC = b"TNDKVPG\n"
FORMAT_VERSION = 1
SUFFIX = ".kvpage"
DEFAULT_MAX_BYTES = 2 * 1024**3
_HEADER_LEN = struct.Struct("<I")
_RETRY_AFTER_S = 60.0  # after a failed write (a full disk), writes stop this long, then are tried again
_STALE_TMP_S = 3600.0  # a temporary file this old was left by a process that died mid-write
_LIVE: weakref.WeakSet[DiskTier] = weakref.WeakSet()  # tiers whose queued pages get a moment at exit


def model_identity(model, page_size: int, dtype: torch.dtype, kv_format: str = "bf16") -> str:
    """A hex digest that changes when the weights, their packing, the KV dtype or format, or the page size change.

    Files are named by path, size and modification time (the same rule as the GGUF reader's cache); a model
    built in memory is named by a sample of its parameters instead.
    """
    h = hashlib.blake2b(digest_size=20)
    config = model.config
    h.update(repr((type(model).__name__, config.architecture, config.num_hidden_layers)).encode())
    h.update(repr((config.num_key_value_heads, config.head_dim, str(dtype), page_size, str(model.dtype))).encode())
    if kv_format != "bf16":
        h.update(kv_format.encode())
    # Packed (int4, K-quant) and float loads of one file give slightly different K/V: the parameter dtypes differ.
    kinds = sorted({str(t.dtype) for t in list(model.parameters()) + list(model.buffers())})
    h.update(repr(kinds).encode())
    source = getattr(model, "source_path", None)
    if source is not None:
        source = Path(source)
        files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
        for p in files:
            st = p.stat()
            h.update(repr((str(p.resolve()), st.st_size, st.st_mtime_ns)).encode())
    else:
        for _, param in list(model.named_parameters())[:8]:
            h.update(param.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    return h.hexdigest()


def _writer(pages: queue.Queue, tier_ref: weakref.ref) -> None:
    """The background writer: one page at a time until a None (close, or the tier was collected)."""
    while True:
        item = pages.get()
        try:
            tier = tier_ref() if item is not None else None
            if tier is None:
                return
            tier._handle(item)
            del tier
        finally:
            pages.task_done()


@atexit.register
def _flush_at_exit(timeout_s: float = 10.0) -> None:
    # Writers are daemon threads (they must never hold a process open): give queued pages a moment at exit.
    deadline = time.monotonic() + timeout_s
    for tier in list(_LIVE):
        while tier._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)


def _name(page_hash: int) -> str:
    return f"{page_hash & 0xFFFFFFFFFFFFFFFF:016x}{SUFFIX}"


class DiskTier:
    """Pages of one model's KV cache in a folder: `contains`, `read` (verified), `write` (queued, never blocks).

    `layout` is (num_layers, page_size, num_kv_heads, head_dim); each layer's K and V rows of a page are
    `[page_size, num_kv_heads, head_dim]` tensors of `dtype` (for a quantized cache, uint8 with head_dim the
    bytes of a head row).
    """

    def __init__(
        self,
        folder: str | Path,
        identity: str,
        layout: tuple[int, int, int, int],
        dtype: torch.dtype,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_queue: int = 64,
    ):
        if max_bytes <= 0:
            raise ValueError(f"the disk cache's size cap must be positive, got {max_bytes} bytes")
        self.root = Path(folder)
        self.identity = identity
        self.folder = self.root / identity[:24]
        self.folder.mkdir(parents=True, exist_ok=True)
        self.layout = layout
        self.dtype = dtype
        self.max_bytes = max_bytes
        num_layers, page_size, heads, dim = layout
        self.page_bytes = 2 * num_layers * page_size * heads * dim * torch.empty((), dtype=dtype).element_size()
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._paused_until = 0.0  # monotonic time before which writes are dropped (after an OSError)
        self._known: set[int] = set()  # hashes this process wrote or read: no second write
        self._bytes = self._scan_bytes()
        # The thread holds only a weak reference: a dropped Cache takes its writer with it (the finalizer ends it).
        self._thread = threading.Thread(
            target=_writer, args=(self._queue, weakref.ref(self)), name="tandem-disk-cache", daemon=True
        )
        self._thread.start()
        weakref.finalize(self, self._queue.put, None)
        _LIVE.add(self)

    # --- reading (the scheduler's thread) ----------------------------------------------------------------

    def path(self, page_hash: int) -> Path:
        return self.folder / _name(page_hash)

    def contains(self, page_hash: int) -> bool:
        return self.path(page_hash).is_file()

    def read(self, page_hash: int, prev_hash: int, token_ids: Sequence[int]) -> list[torch.Tensor] | None:
        """The page's K and V rows per layer (K0, V0, K1, V1, ...), or None when the file is missing or fails a
        check (then it is logged and deleted, and the caller recomputes the page)."""
        path = self.path(page_hash)
        try:
            data = path.read_bytes()
        except OSError as e:
            log.info("disk cache: cannot read %s (%s); computing the page instead", path, e)
            return None
        problem, payload = self._check(data, page_hash, prev_hash, token_ids)
        if problem is not None:
            log.warning("disk cache: skipping %s: %s; the page is computed again", path, problem)
            self._discard(path)
            return None
        try:
            os.utime(path)  # most recently used: evicted last
        except OSError:
            pass
        self._known.add(page_hash)
        rows = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(self.dtype)
        num_layers, page_size, heads, dim = self.layout
        return list(rows.view(2 * num_layers, page_size, heads, dim).unbind(0))

    def _check(self, data: bytes, page_hash: int, prev_hash: int, token_ids: Sequence[int]) -> tuple[str | None, bytes]:
        if len(data) < len(MAGIC) + _HEADER_LEN.size or not data.startswith(MAGIC):
            return "not a Tandem cache page (bad magic or truncated)", b""
        (header_len,) = _HEADER_LEN.unpack_from(data, len(MAGIC))
        start = len(MAGIC) + _HEADER_LEN.size
        try:
            header = json.loads(data[start : start + header_len])
        except ValueError:
            return "its header is damaged", b""
        if not isinstance(header, dict):
            return "its header is damaged", b""
        payload = data[start + header_len :]
        for key, value in self._page_fields(page_hash, prev_hash, token_ids).items():
            if header.get(key) != value:
                return f"its {key} does not match this model and prompt", b""
        if len(payload) != self.page_bytes or header.get("payload_bytes") != self.page_bytes:
            return f"truncated ({len(payload)} of {self.page_bytes} payload bytes)", b""
        if header.get("checksum") != _checksum(payload):
            return "its checksum does not match (damaged)", b""
        return None, payload

    def _page_fields(self, page_hash: int, prev_hash: int, token_ids: Sequence[int]) -> dict[str, object]:
        """What a page's header must say for it to be this model's page of these tokens."""
        return {
            "version": FORMAT_VERSION,
            "identity": self.identity,
            "layout": list(self.layout),
            "dtype": str(self.dtype),
            "hash": page_hash,
            "prev_hash": prev_hash,
            "token_ids": list(token_ids),
        }

    # --- writing (queued; the background thread does the work) ------------------------------------------

    def write(self, page_hash: int, prev_hash: int, token_ids: Sequence[int], rows: list[torch.Tensor]) -> bool:
        """Queue a page for writing; `rows` must be private copies (K0, V0, K1, V1, ...). False when dropped."""
        if page_hash in self._known or time.monotonic() < self._paused_until:
            return False
        try:
            self._queue.put_nowait((page_hash, prev_hash, tuple(token_ids), rows))
        except queue.Full:
            return False  # the disk is slower than the prompts: this page stays in memory only
        self._known.add(page_hash)
        return True

    def flush(self) -> None:
        """Wait until every queued page is written (or dropped)."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued, then end the writer thread."""
        _LIVE.discard(self)
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _handle(self, item: tuple) -> None:
        try:
            if time.monotonic() >= self._paused_until:
                self._write_now(*item)
        except Exception:  # a write must never end the thread: the next pages still get their chance
            log.exception("disk cache: writing a page failed")

    def _write_now(self, page_hash: int, prev_hash: int, token_ids: tuple[int, ...], rows: list[torch.Tensor]) -> None:
        path = self.path(page_hash)
        if path.is_file():
            return  # another process wrote it
        payload = b"".join(r.contiguous().cpu().view(torch.uint8).numpy().tobytes() for r in rows)
        header = {
            **self._page_fields(page_hash, prev_hash, token_ids),
            "payload_bytes": len(payload),
            "checksum": _checksum(payload),
        }
        head = json.dumps(header, separators=(",", ":")).encode()
        tmp = self.folder / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(MAGIC + _HEADER_LEN.pack(len(head)) + head + payload)
            os.replace(tmp, path)
        except OSError as e:
            self._discard(tmp)
            self._known.discard(page_hash)
            self._paused_until = time.monotonic() + _RETRY_AFTER_S
            reason = "the disk is full" if e.errno == errno.ENOSPC else str(e)
            log.warning(
                "disk cache: cannot write to %s (%s); pages stay in memory only, retrying in %.0f s. Free space "
                "or choose another cache folder.",
                self.folder,
                reason,
                _RETRY_AFTER_S,
            )
            return
        self._bytes += path.stat().st_size if path.exists() else 0
        if self._bytes > self.max_bytes:
            self._evict()

    # --- size cap ------------------------------------------------------------------------------------------

    def _files(self) -> list[tuple[float, int, Path]]:
        """(modification time, size, path) of every page in the root folder (all models), oldest first."""
        found = []
        for path in self.root.glob(f"*/*{SUFFIX}"):
            try:
                st = path.stat()
            except OSError:
                continue  # evicted by another process meanwhile
            found.append((st.st_mtime, st.st_size, path))
        return sorted(found)

    def _scan_bytes(self) -> int:
        now = time.time()
        for tmp in self.root.glob("*/.*.tmp"):
            try:
                if now - tmp.stat().st_mtime > _STALE_TMP_S:
                    tmp.unlink()
            except OSError:
                pass
        return sum(size for _, size, _ in self._files())

    def _evict(self) -> None:
        """Delete the least recently used pages until the folder holds at most 90% of the cap."""
        files = self._files()
        total = sum(size for _, size, _ in files)
        for _, size, path in files:
            if total <= 0.9 * self.max_bytes:
                break
            self._discard(path)
            total -= size
        self._bytes = total

    @staticmethod
    def _discard(path: Path) -> None:
        try:
            path.unlink()
        except OSError:
            pass  # gone already (another process), or read-only: it is skipped on every read anyway


def _checksum(payload: bytes) -> str:
    return hashlib.blake2b(payload, digest_size=16).hexdigest()
