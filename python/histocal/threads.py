"""histocal's worker threads: the size of the Rust pool its kernels run on."""

from __future__ import annotations

from typing import Any

from . import _core


def set_num_threads(n: Any) -> None:
    """Set the number of histocal's worker threads.

    Args:
        n: the threads, a whole number; 0: the default (``HISTOCAL_NUM_THREADS``, else one per
            usable core).

    Raises:
        TypeError: ``n`` is not a whole number.
        ValueError: ``n`` is negative or too large.
    """
    _core.set_num_threads(n)


def get_num_threads() -> int:
    """The number of histocal's worker threads.

    Returns:
        The Rust pool's thread count now.
    """
    return _core.get_num_threads()
