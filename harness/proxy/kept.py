"""What the proxy keeps of an answer for the recorder while relaying it: the whole answer up to
KEEP_HEAD bytes; past that, the head and a rolling tail of at most KEEP_TAIL bytes (plus the
chunk that crossed it), the rest dropped and counted. Memory per call stays flat in the answer's
size; a stream's usage and end, which come last, stay readable.
"""

from __future__ import annotations

from collections import deque

KEEP_HEAD = 16 * 1024 * 1024  # an answer up to this is kept whole
KEEP_TAIL = 1024 * 1024  # past it, only its last this many bytes


class Kept:
    """The kept bytes of one answer; `add` is O(len(chunk)) amortised (no bytes copied)."""

    __slots__ = ("_head", "_head_size", "_tail", "_tail_size", "dropped")

    def __init__(self) -> None:
        self._head: list[bytes] = []
        self._head_size = 0
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self.dropped = 0  # bytes of the answer not kept

    @property
    def size(self) -> int:
        """Bytes kept now."""
        return self._head_size + self._tail_size

    def add(self, chunk: bytes) -> None:
        if not self._tail and self._head_size + len(chunk) <= KEEP_HEAD:
            self._head.append(chunk)
            self._head_size += len(chunk)
            return
        self._tail.append(chunk)
        self._tail_size += len(chunk)
        while len(self._tail) > 1 and self._tail_size - len(self._tail[0]) >= KEEP_TAIL:
            first = self._tail.popleft()
            self._tail_size -= len(first)
            self.dropped += len(first)

    def bytes(self) -> bytes | None:
        """The kept answer (None when nothing came): the whole answer, or, when bytes were
        dropped, the head, a blank line (ending the event the head cut) and the tail."""
        if not self._head and not self._tail:
            return None
        if not self.dropped:
            return b"".join((*self._head, *self._tail))
        return b"".join((*self._head, b"\n\n", *self._tail))
