"""How a summary collected beside the streaming histograms is stored in a state file.

A summary (the Rust ``collection::summary``: pow2's per-batch votes, isotone's top-two pairs) is one
:class:`SummaryMembers` instance, registered in :mod:`histocal.state.summary_members`: the zip members it
writes, where they go in the file, the file-format version they need, how their sizes are bounded before
they are read, and how they are written from and read back into a ``_core.StreamHistograms`` (whose
``restore_summary`` checks what is read). ``file_format`` and ``state`` handle every summary through it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

# The most bytes a loaded state holds in memory, its bins (8 bytes each) and its summaries together (their
# members' sizes as the zip directory declares them, checked before any is read): 2 GiB
# (file_format.MAX_STATE_BINS is this in bins). Read at check time, as ``summary_format.MAX_HELD_BYTES``.
MAX_HELD_BYTES = 8 << 28


class SummaryMembers(ABC):
    """One summary's members in the state file."""

    #: the Rust summary's name (``StreamHistograms(..., summaries=[name])``, ``export_summary``)
    summary: str
    #: its members: name -> (dtype, ndim, columns), as ``file_format.MEMBERS``
    members: ClassVar[dict[str, tuple[str, int, int | None]]]
    #: the member after which its members are written (the order of a file's members is fixed)
    after: str
    #: the lowest format version in which its members may appear
    version: int
    #: the member whose presence says the summary was collected
    first: str
    #: the members read after all others, bounded by ``later_limits``
    later: tuple[str, ...]

    def first_limit(self, tensors: int) -> int:
        """The most bytes of ``first`` for a state of ``tensors`` tensors, known from the header (0: it is
        bounded once other members are read, by ``later_limits``)."""
        return 0

    @abstractmethod
    def later_limits(self, arrays: dict[str, np.ndarray], tensors: int, held_bins: int) -> dict[str, int]:
        """The most bytes of each member read after the others (``first`` and the stream members are in
        ``arrays``, checked here against ``tensors`` and the state's ``held_bins``)."""

    def nested_bytes(self, channels: int, bytes_left: int) -> int:
        """The most bytes its members take in a per-channel state of ``channels`` channels, within the
        ``bytes_left`` that the bins leave of the memory limit (0: not collected per channel)."""
        return 0

    @abstractmethod
    def write(self, stream: Any, names: list[str]) -> dict[str, np.ndarray]:
        """Its members for ``stream``'s tensors ``names`` (``stream`` collects the summary)."""

    @abstractmethod
    def read(self, stream: Any, names: list[str], arrays: dict[str, np.ndarray]) -> None:
        """Put the members' summaries into ``stream`` (made to collect it), checked; ``fail`` on a problem."""
