"""Which cache page holds what: chained-hash prefix index, reference counts, LRU reuse. No tensors here.

A full page of tokens is named by a chained hash, hash((previous page's hash, token ids)), so equal hashes
mean equal prefixes (the token ids are also compared on every hit, so a hash collision cannot alias).

    job A:  [p3: t0..t15 h1] -> [p7: t16..t31 h2] -> [p2: t32..t40, partial]
    job B:  [p3 shared     ] -> [p7 shared      ] -> [p9: copy of p2's first rows, then its own tokens]

Pages referenced by no job keep their KV, tokens and hash, and wait in an LRU list: a later job with the same
prefix picks them up again; allocation takes never-used pages first, then the least recently released.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

ROOT_HASH = 0


def chain_hash(prev_hash: int, token_ids: Sequence[int]) -> int:
    """Name of a full page: its tokens and everything before it (ints hash deterministically in Python)."""
    return hash((prev_hash, tuple(token_ids)))


@dataclass
class Page:
    page_id: int
    ref_count: int = 0
    prev_hash: int = ROOT_HASH  # hash of the chain before this page: what its tokens follow
    token_ids: list[int] = field(default_factory=list)  # tokens whose K/V rows are valid, in order
    hash: int | None = None  # set once the page is full and registered in the index
    owner: int | None = None  # serial of the job computing the page's rows; None when nobody is
    slot: int | None = None  # the window slot holding its sliding-window layers' rows, if any (window.py)

    @property
    def num_valid(self) -> int:
        return len(self.token_ids)


class PageTable:
    """Allocation and sharing of `num_pages` pages of `page_size` tokens."""

    def __init__(self, num_pages: int, page_size: int, on_forget: Callable[[Page], None] | None = None):
        self.page_size = page_size
        self._on_forget = on_forget  # told when a page's rows stop being its own (the window slots' owner)
        self.pages = [Page(i) for i in range(num_pages)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_pages))
        self._by_hash: dict[int, int] = {}  # chain hash -> page id
        self._children: dict[int, set[int]] = {}  # prev_hash -> ids of pages whose tokens follow it

    # --- counting ----------------------------------------------------------------------------------------

    @property
    def num_pages(self) -> int:
        return len(self.pages)

    @property
    def num_free(self) -> int:
        """Pages no job references (they may still hold a cached prefix)."""
        return len(self._free)

    def pages_for(self, num_tokens: int) -> int:
        return (num_tokens + self.page_size - 1) // self.page_size

    # --- prefix lookup -----------------------------------------------------------------------------------

    def match_full_pages(self, token_ids: Sequence[int], max_tokens: int) -> list[Page]:
        """Cached full pages covering a prefix of `token_ids`, at most `max_tokens` tokens long."""
        matched: list[Page] = []
        prev = ROOT_HASH
        ps = self.page_size
        for start in range(0, max_tokens - ps + 1, ps):
            chunk = token_ids[start : start + ps]
            h = chain_hash(prev, chunk)
            page_id = self._by_hash.get(h)
            if page_id is None:
                break
            page = self.pages[page_id]
            if page.hash != h or page.prev_hash != prev or page.token_ids != list(chunk):
                break
            matched.append(page)
            prev = h
        return matched

    def best_partial(self, prev_hash: int, token_ids: Sequence[int], max_tokens: int) -> tuple[Page | None, int]:
        """The page following `prev_hash` whose valid rows share the longest prefix with `token_ids`."""
        best, best_len = None, 0
        limit = min(max_tokens, len(token_ids))
        for page_id in self._children.get(prev_hash, ()):
            page = self.pages[page_id]
            n = 0
            for a, b in zip(page.token_ids, token_ids[:limit]):
                if a != b:
                    break
                n += 1
            if n > best_len:
                best, best_len = page, n
        return best, best_len

    # --- references --------------------------------------------------------------------------------------

    def acquire(self, page: Page) -> None:
        """Take a reference to a page found by a prefix match."""
        if page.ref_count == 0:
            del self._free[page.page_id]
        page.ref_count += 1

    def release(self, page: Page) -> None:
        if page.ref_count <= 0:
            raise RuntimeError(f"page {page.page_id} released more often than acquired")
        page.ref_count -= 1
        if page.ref_count == 0:
            if page.num_valid == 0:
                # Nothing cached: reuse it before any page that still holds a prefix.
                self._forget(page)
                self._free[page.page_id] = None
                self._free.move_to_end(page.page_id, last=False)
            else:
                self._free[page.page_id] = None  # most recently released goes last
            page.owner = None

    def allocate(self, prev_hash: int, owner: int, after: int | None = None) -> Page:
        """A fresh page for tokens that follow `prev_hash`; its old content (if any) is forgotten.

        `after`: the page before it in the sequence. Page `after + 1` is taken when it is free and holds
        nothing cached (so no prefix is evicted out of LRU order): a sequence's pages then tend to form one
        run, which attention reads as a view instead of gathering page by page.
        """
        if not self._free:
            raise RuntimeError("no free page; admission should have checked num_free")
        if after is not None and after + 1 in self._free and self.pages[after + 1].num_valid == 0:
            page_id = after + 1
            del self._free[page_id]
        else:
            page_id, _ = self._free.popitem(last=False)
        page = self.pages[page_id]
        self._forget(page)
        page.ref_count = 1
        page.prev_hash = prev_hash
        page.owner = owner
        self._children.setdefault(prev_hash, set()).add(page_id)
        return page

    def reparent(self, page: Page, prev_hash: int) -> None:
        """Record that `page` now follows `prev_hash` (its previous page just became full and named)."""
        self._unlink_child(page)
        page.prev_hash = prev_hash
        self._children.setdefault(prev_hash, set()).add(page.page_id)

    def register_full(self, page: Page) -> int:
        """Name a page whose rows are all valid, so later prompts can share it. Returns its hash."""
        h = chain_hash(page.prev_hash, page.token_ids)
        page.hash = h
        self._by_hash.setdefault(h, page.page_id)
        return h

    def truncate(self, page: Page, num_valid: int) -> None:
        """Drop rows past `num_valid` (a rewind); the page is no longer full, so unname it."""
        del page.token_ids[num_valid:]
        if page.hash is not None:
            if self._by_hash.get(page.hash) == page.page_id:
                del self._by_hash[page.hash]
            page.hash = None

    def _forget(self, page: Page) -> None:
        if self._on_forget is not None:
            self._on_forget(page)
        if page.hash is not None and self._by_hash.get(page.hash) == page.page_id:
            del self._by_hash[page.hash]
        self._unlink_child(page)
        page.hash = None
        page.token_ids = []
        page.prev_hash = ROOT_HASH

    def _unlink_child(self, page: Page) -> None:
        # An emptied set is dropped: hashes of long-gone prefixes would otherwise pile up as empty keys.
        children = self._children.get(page.prev_hash)
        if children is not None:
            children.discard(page.page_id)
            if not children:
                del self._children[page.prev_hash]

    # --- checks (used by tests) --------------------------------------------------------------------------

    def referenced_pages(self) -> list[Page]:
        return [p for p in self.pages if p.ref_count > 0]
