"""Reversible, counted patches of other packages' module attributes (``patch_onnxruntime``,
``patch_quark``): the first use replaces the attributes, nested uses are counted, and the
originals are back once every use is undone. Thread-safe.

What a patch installs goes through :meth:`CountedPatch.route`: a client may bind the installed
function by name while patched (``from onnxruntime.quantization.calibrate import create_calibrator``
in a module imported then) and keep it after the undo, which restores only the attributes the
patch set; routed, that binding goes to the original again once the patch is undone."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

# (object, attribute, new value): one replacement
Replacement = tuple[Any, str, Any]
_Use = TypeVar("_Use", bound="PatchUse")
_Function = TypeVar("_Function", bound=Callable[..., Any])


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

    def route(self, ours: _Function, original: Callable[..., Any]) -> _Function:
        """A function to install in place of ``original``: ``ours`` while a use holds this patch,
        ``original`` otherwise (so a name bound to it while patched follows the undo).

        Args:
            ours: what the patch calls while active.
            original: what it replaces, called once the patch is undone.

        Returns:
            ``ours``'s name, docstring and signature (``__wrapped__``), routed by the patch's state.
        """

        @functools.wraps(ours)
        def routed(*args: Any, **kwargs: Any) -> Any:
            return (ours if self.active else original)(*args, **kwargs)

        return routed  # type: ignore[return-value]

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
