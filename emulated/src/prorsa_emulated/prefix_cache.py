"""A per-rank prefix cache in the manner of SGLang's radix cache, at page granularity.

A prompt is a chain of page keys: key i hashes key i-1 and the tokens of page i, so two
prompts share key i exactly when they share their first (i+1) pages. The cache holds
pages (``PAGE`` tokens each) with a lock count (pages a running request reads cannot be
evicted) and a recency stamp; eviction is least-recently-used among unlocked pages, the
deepest pages of a path first. A page whose parent was evicted is unreachable and goes
the same way later: loosely a radix tree, honestly accounted in tokens.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PAGE = 16
"""Tokens per cache page (SGLang matches per token with page size 1; 16 keeps it cheap)."""


def page_keys(tokens: Sequence[object], start_key: int = 0) -> list[int]:
    """Chained keys of every full page of ``tokens``."""
    keys, h = [], start_key
    for i in range(0, len(tokens) - PAGE + 1, PAGE):
        h = hash((h, tuple(tokens[i:i + PAGE])))
        keys.append(h)
    return keys


def synthetic_keys(prefix_id: str, n_tokens: int) -> list[int]:
    """Keys of a prompt known only by length: token i of ``prefix_id`` is ``(prefix_id, i)``,
    so every turn of one conversation shares the pages of the turns before it."""
    keys, h = [], 0
    for i in range(n_tokens // PAGE):
        h = hash((h, prefix_id, i))
        keys.append(h)
    return keys


_EMULATED_PROMPT = re.compile(r"^([0-9a-f]{16}) <([0-9]{1,9}) emulated tokens>$")


def emulated_prompt_text(prefix_id: str, n_tokens: int) -> str:
    """The ``text`` of a request for a prompt known only by length and conversation: routers
    forward ``text`` untouched (sglang-router drops fields SGLang does not define), and the
    emulated engines read it back with :func:`parse_emulated_prompt`. The conversation's
    digest comes first, so a cache-aware router's text-prefix match sends a conversation's
    turns to one worker and spreads different conversations."""
    digest = hashlib.blake2b(prefix_id.encode(), digest_size=8).hexdigest()
    return f"{digest} <{int(n_tokens)} emulated tokens>"


def parse_emulated_prompt(text: object) -> tuple[str, int] | None:
    """(conversation digest, tokens) of an :func:`emulated_prompt_text`, else None."""
    m = _EMULATED_PROMPT.match(text) if isinstance(text, str) else None
    return (m.group(1), int(m.group(2))) if m and int(m.group(2)) >= 1 else None


@dataclass
class _Page:
    lock: int = 0
    stamp: int = 0


class PrefixCache:
    """Pages of one rank's KV pool that hold cached prefixes."""

    def __init__(self) -> None:
        self._pages: dict[int, _Page] = {}
        self._heap: list[tuple[int, int]] = []
        self._clock = itertools.count(1)
        self.locked_pages = 0

    @property
    def tokens(self) -> int:
        """Tokens of KV the cache occupies (locked or not)."""
        return len(self._pages) * PAGE

    @property
    def evictable_tokens(self) -> int:
        return (len(self._pages) - self.locked_pages) * PAGE

    def _touch(self, keys: Sequence[int]) -> None:
        # Deeper pages get older stamps so a path is evicted from its end.
        base = next(self._clock)
        for _ in keys:
            next(self._clock)
        for depth, k in enumerate(keys):
            p = self._pages[k]
            p.stamp = base + len(keys) - depth
            heapq.heappush(self._heap, (p.stamp, k))

    def match_len(self, keys: Sequence[int]) -> int:
        """Pages of ``keys`` cached, from the start."""
        n = 0
        for k in keys:
            if k not in self._pages:
                break
            n += 1
        return n

    def match_and_lock(self, keys: Sequence[int]) -> list[int]:
        """Lock and return the longest cached prefix of ``keys``."""
        hit = []
        for k in keys:
            if k not in self._pages:
                break
            hit.append(k)
        for k in hit:
            p = self._pages[k]
            if p.lock == 0:
                self.locked_pages += 1
            p.lock += 1
        if hit:
            self._touch(hit)
        return hit

    def unlock(self, keys: Iterable[int]) -> None:
        """Release pages a request locked (pages evicted meanwhile are ignored)."""
        for k in keys:
            p = self._pages.get(k)
            if p is None or p.lock == 0:
                continue
            p.lock -= 1
            if p.lock == 0:
                self.locked_pages -= 1
                heapq.heappush(self._heap, (p.stamp, k))

    def insert(self, keys: Sequence[int]) -> int:
        """Add the pages of a finished sequence; returns the tokens newly cached."""
        new = 0
        for k in keys:
            if k not in self._pages:
                self._pages[k] = _Page()
                new += 1
        if keys:
            self._touch(keys)
        return new * PAGE

    def evict(self, tokens: int) -> int:
        """Evict at least ``tokens`` tokens of unlocked pages if possible; returns tokens freed."""
        freed = 0
        while freed < tokens and self._heap:
            stamp, k = heapq.heappop(self._heap)
            p = self._pages.get(k)
            if p is None or p.lock or p.stamp != stamp:
                continue  # stale heap entry
            del self._pages[k]
            freed += PAGE
        return freed

    def clear(self) -> None:
        """Drop every unlocked page (``/flush_cache``, role switch)."""
        self._pages = {k: p for k, p in self._pages.items() if p.lock}
        self._heap = [(p.stamp, k) for k, p in self._pages.items()]
        heapq.heapify(self._heap)
