"""Reversible, counted patches of other packages' module attributes (``patch_onnxruntime``,
``patch_quark``): the first use replaces the attributes, nested uses are counted, and the
originals are back once every use is undone. Thread-safe."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

# (object, attribute, new value): one replacement
Replacement = tuple[Any, str, Any]
_Use = TypeVar("_Use", bound="PatchUse")


class CountedPatch:
    """Attribute replacements applied while at least one use holds them.

    Args:
        replacements: called at the first use: the ``(object, attribute, new value)`` to set
            (it may import what it patches; an exception leaves nothing patched).
    """

    def __init__(self, replacements: Callable[[], list[Replacement]]) -> None:
        self._replacements = replacements
        self._lock = threading.Lock()
        self._depth = 0
        self._saved: list[Replacement] = []

    def apply(self) -> None:
        """Add a use: the first one sets the replacements, keeping the originals.

        Raises:
            Exception: what ``replacements`` raises (then nothing is patched and no use is added).
        """
        with self._lock:
            if self._depth == 0:
                replacements = self._replacements()
                self._saved = [(target, attr, getattr(target, attr)) for target, attr, _ in replacements]
                for target, attr, new in replacements:
                    setattr(target, attr, new)
            self._depth += 1

    def undo(self) -> None:
        """Remove a use: the last one puts the originals back. Without a use, a no-op."""
        with self._lock:
            if self._depth == 0:
                return
            self._depth -= 1
            if self._depth == 0:
                for target, attr, original in reversed(self._saved):
                    setattr(target, attr, original)
                self._saved.clear()

    @property
    def active(self) -> bool:
        """Whether a use holds the patch now."""
        with self._lock:
            return self._depth > 0


class PatchUse:
    """One use of a subclass's ``PATCH``: applied on construction, so ``Use()`` alone patches until
    the patch's undo; ``with Use(): ...`` patches for the block only."""

    PATCH: ClassVar[CountedPatch]

    def __init__(self) -> None:
        self.PATCH.apply()
        self._active = True

    def __enter__(self: _Use) -> _Use:
        if not self._active:
            self.PATCH.apply()
            self._active = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._active:
            self._active = False
            self.PATCH.undo()
