"""Per-rank "activity" slots in a small shared file: what each worker last fired, readable after it dies.

Each rank owns four int64 slots, written by its executor as it fires (a plain store, no lock):
    [0] last compute actor index + 1 (0: none yet)   [1] that actor's firing
    [2] last communication actor index + 1          [3] that actor's firing
When a worker is SIGKILLed (OOM killer, a faulty kernel), the driver reads its slots to name the actor it
was running. The slots live in a memory-mapped file, because workers are fresh ``python -m sbplab.worker``
processes that share no memory with the driver otherwise. The file is unlinked as soon as it is made and
workers inherit its descriptor, so nothing is left on disk, even when the driver itself is SIGKILLed.
"""

from __future__ import annotations

import mmap
import os
import tempfile

SLOTS_PER_RANK = 4
_ITEM = 8  # int64


class ActivityBoard:
    """``n`` ranks' slots in one file; ``slot(r)`` is an indexable view of rank r's four int64s."""

    def __init__(self, fd: int, n: int, *, owner: bool = False) -> None:
        self.fd, self.n, self._owner = fd, n, owner
        self._map = mmap.mmap(fd, n * SLOTS_PER_RANK * _ITEM)
        self._all = memoryview(self._map).cast("q")  # shape (n * 4,)
        self._views: list[memoryview] = []

    @classmethod
    def create(cls, n: int) -> ActivityBoard:
        """A zeroed board in a file only this user could open (mkstemp: 0600), unlinked at once; workers
        get its descriptor (``fd``, inheritable)."""
        fd, path = tempfile.mkstemp(prefix="sbplab-activity-")
        os.unlink(path)
        os.write(fd, bytes(n * SLOTS_PER_RANK * _ITEM))
        os.set_inheritable(fd, True)
        return cls(fd, n, owner=True)

    def slot(self, rank: int) -> memoryview:
        if not 0 <= rank < self.n:
            raise ValueError(f"rank {rank} is outside this activity board of {self.n} ranks")
        view = self._all[rank * SLOTS_PER_RANK:(rank + 1) * SLOTS_PER_RANK]
        self._views.append(view)
        return view

    def slots(self) -> list[memoryview]:
        return [self.slot(r) for r in range(self.n)]

    def clear(self) -> None:
        self._all[:] = memoryview(bytes(len(self._all) * _ITEM)).cast("q")

    def close(self) -> None:
        """Unmap, and close the file if this board made it. Views handed out stop working."""
        for v in self._views + [self._all]:
            v.release()
        self._views = []
        try:
            self._map.close()
        except BufferError:  # someone still holds a view: the map goes with the last reference
            pass
        if self._owner:
            os.close(self.fd)
            self._owner = False
