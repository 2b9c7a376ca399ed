"""Per-rank "activity" slots in a small shared file: what each worker last fired, readable after it dies.

Each rank owns four int64 slots, written by its executor as it fires (a plain store, no lock):
    [0] last compute actor index + 1 (0: none yet)   [1] that actor's firing
    [2] last communication actor index + 1          [3] that actor's firing
When a worker is SIGKILLed (OOM killer, a faulty kernel), the driver reads its slots to name the actor it
was running. The slots live in a memory-mapped file in a private temporary folder, because workers are
fresh ``python -m sbplab.worker`` processes that share no memory with the driver otherwise.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile

SLOTS_PER_RANK = 4
_ITEM = 8  # int64


class ActivityBoard:
    """``n`` ranks' slots in one file; ``slot(r)`` is an indexable view of rank r's four int64s."""

    def __init__(self, path: str, n: int, *, owner_dir: str | None = None) -> None:
        self.path, self.n, self._owner_dir = path, n, owner_dir
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), n * SLOTS_PER_RANK * _ITEM)
        self._all = memoryview(self._map).cast("q")  # shape (n * 4,)
        self._views: list[memoryview] = []

    @classmethod
    def create(cls, n: int) -> ActivityBoard:
        """A zeroed board in a new folder only this user can read (mkdtemp makes it 0700)."""
        folder = tempfile.mkdtemp(prefix="sbplab-")
        path = os.path.join(folder, "activity")
        with open(path, "wb") as f:
            f.write(bytes(n * SLOTS_PER_RANK * _ITEM))
        return cls(path, n, owner_dir=folder)

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
        """Unmap, and delete the folder if this board created it. Views handed out stop working."""
        for v in self._views + [self._all]:
            v.release()
        self._views = []
        try:
            self._map.close()
        except BufferError:  # someone still holds a view: the map goes with the last reference
            pass
        if self._owner_dir is not None:
            shutil.rmtree(self._owner_dir, ignore_errors=True)
            self._owner_dir = None
