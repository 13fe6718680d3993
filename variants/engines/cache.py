"""A bounded cache for what is fixed while the parameters and the grid are."""

from __future__ import annotations

from collections.abc import Callable


class Recent(dict):
    """A dict that keeps its ``kept`` most recently inserted entries: the caches of what is
    fixed while the parameters and the grid are (kernel corrections, key weights, pass
    plans) and the warm starts kept per grid and matrix."""

    def __init__(self, kept: int):
        super().__init__()
        self.kept = kept

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        while len(self) > self.kept:
            del self[next(iter(self))]

    def get_or_make(self, key, make: Callable[[], object]):
        """``self[key]``, made by ``make()`` where it is missing."""
        if key not in self:
            self[key] = make()
        return self[key]
