"""The calibration state file's format: its members, its versions, and the limits a reader holds it to.

File format (``.npz``-compatible zip, written atomically with ``cache.atomic_write_bytes``): only
plain little-endian numeric ``.npy`` members, never pickles:

* ``header.npy``: uint8, UTF-8 JSON: ``format`` (``"histocal-calibration-state"``), ``version`` (1, or 2 with a summary's members that need it),
  ``histocal_version``, ``model_fingerprint`` (sha256 hex of the graph, see
  :func:`model_fingerprint`), ``data_fingerprints`` (sorted list of the runs' data fingerprints),
  ``options`` (``mode``, ``streaming_bins``, ``exact_kind``, ``exact_num_bins``, ``method``,
  ``settings``) and ``tensors`` (per tensor: ``name``, ``dtype``, ``stream`` = ``{level, start,
  length}`` (the non-zero span of the bins) or null, ``exact`` = ``{edge_dtype, bins}`` or null);
* ``stream_bins`` (the spans concatenated, as the narrowest of uint8/16/32/64 that holds them), ``stream_stats`` (float64 (n, 3): finite min,
  finite max, min |x|; NaN when there are no finite values), ``stream_counts`` (uint64 (n, 5):
  finite, NaN, +Inf, -Inf, batches);
* ``exact_hist`` (concatenated, int64 or the narrowest of uint8/16/32 that holds the counts), ``exact_edges_float16/32/64`` (edges concatenated per edge
  dtype), ``exact_scalars`` (float64 (n, 3): min, max, threshold (NaN for |x|)), ``exact_flags``
  (uint8 (n, 3): whether ORT holds each as a 0-d array), ``exact_counts`` (uint64 (n, 5)).

The summaries collected beside the streaming histograms add their members, each as its
:class:`SummaryMembers` in :mod:`histocal.state.file.summaries` says (the member it follows, the version
it needs), present exactly when the summary was collected.

Version 2 adds per-channel histograms (:mod:`histocal.state.channels`); a state without them is written
as version 1, byte for byte as before, and both versions are read. A version-2 header has one more
key, ``channels``: ``{axis, tensors: [[name, channels], ...]}``, and the member ``channels`` (uint8)
holds a complete state file of the channel histograms (streaming mode, one tensor per channel key
``name[c]``, in order; version 1, or 2 with a summary's members when they were collected per channel, but
never with channels of its own), read with the same checks as the outer file, in place: its directory and
header are checked first (no channels member or key, exactly the declared channel count of the outer
``streaming_bins``), and its declared size is bounded by the header (and, deflated, by ``MAX_NESTED_RATIO``).

Loading treats the file as untrusted and checks every size before taking the memory for it: the file
size (``MAX_STATE_BYTES``), the zip directory (at most ``MAX_ZIP_DIRECTORY`` bytes are read to find and
parse it; members' count, names, compression, declared sizes), the JSON header member (read first, at most
``MAX_HEADER_BYTES``, bounded nesting, every field's type and range validated), the content it declares
(tensors x ``streaming_bins`` + exact bins + channels x ``streaming_bins`` at most ``MAX_STATE_BINS``, bins
and ``num_bins`` settings at most ``_core.MAX_BINS``), then, from the zip directory alone, the members the
header cannot pin down (the channels member, each summary's members): deflated, at most
``MAX_NESTED_RATIO`` (channels) or ``MAX_SUMMARY_RATIO`` (a summary's members together) times their compressed
size + ``MEMBER_SLACK``, and the summaries' declared bytes with the bins (8 bytes each) within
``MAX_HELD_BYTES``; then each other member's declared size against
the content before it is decompressed, read in chunks (a summary's later members
against what its members read first declare). ``check_members`` is these checks, run by loading and by
saving (``check_readable``, on the zip just written, so that every state histocal writes it reads back). Every
``.npy`` header is checked (dtype, shape, size) before its data is used,
and the arrays go through the Rust ``restore`` checks. Every problem is a ``ValueError`` naming the file
and the problem (``FileNotFoundError`` for a missing path), running out of memory included.

The checks are :mod:`~histocal.state.file.read`'s (the header's: :mod:`~histocal.state.file.header`); they
read the limits here at check time (``format.MAX_STATE_BINS``), one value for every check.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np

FORMAT_NAME = "histocal-calibration-state"
# Version 2 adds optional content: per-channel histograms (the header key and member ``channels``)
# and summaries whose members need it (``SummaryMembers.version``). A state with neither is written as version 1,
# which earlier histocal versions read.
FORMAT_VERSION = 2
FORMAT_VERSIONS = (1, 2)
MAX_STATE_BYTES = 4 << 30  # file size, and the members' total uncompressed size
MAX_HEADER_BYTES = 64 << 20  # the JSON header
# The most bytes a loaded state holds in memory, its bins (8 bytes each) and its summaries together (their
# members' sizes as the zip directory declares them, checked before any is read): 2 GiB.
MAX_HELD_BYTES = 8 << 28
# Bins a loaded state holds in memory, tensors x streaming_bins + exact bins: 2 GiB of counts (16384 tensors
# at the default 16384 streaming bins). A header declaring more is refused before anything is allocated.
MAX_STATE_BINS = MAX_HELD_BYTES // 8
# Deflated members whose size the header cannot pin down may declare at most so many times their compressed
# size (plus MEMBER_SLACK), so that a small file cannot make the loader inflate gigabytes (deflate reaches
# 1032:1 on zeros). A channels member is a state file compressed as its outer file is (histocal writes both
# with the same ``compress``): 4. A summary's members together (their ratios: state/file/summaries.py; a
# summary's row counts alone deflate up to 1000:1 when most rows are seen once): histocal's reach about
# 15:1, so 64 leaves room.
MAX_NESTED_RATIO = 4
MAX_SUMMARY_RATIO = 64
MEMBER_SLACK = 1 << 20
MAX_JSON_DEPTH = 8
MAX_MEMBERS = 16
MAX_NAME_CHARS = 1 << 16
MAX_NPY_HEADER = 4096  # a member's .npy header (numpy writes 128 bytes)
MAX_ZIP_DIRECTORY = 1 << 20  # what zipfile may read to find and parse the central directory

DTYPES = ("float16", "float32", "float64")
MODES = ("exact", "streaming")
KINDS = ("value", "abs")

#: a member's spec: (dtype, ndim, columns); dtype ``a|b`` allows either (the narrowest that holds the counts)
MemberSpec = tuple[str, int, int | None]

# zip members of the histograms, in the order a file holds them (each summary's go after the member it names)
BASE_MEMBERS: dict[str, MemberSpec] = {
    "header": ("u1", 1, None),
    "stream_bins": ("<u8|<u4|<u2|u1", 1, None),
    "stream_stats": ("<f8", 2, 3),
    "stream_counts": ("<u8", 2, 5),
    "exact_hist": ("<i8|<u4|<u2|u1", 1, None),
    "exact_edges_float16": ("<f2", 1, None),
    "exact_edges_float32": ("<f4", 1, None),
    "exact_edges_float64": ("<f8", 1, None),
    "exact_scalars": ("<f8", 2, 3),
    "exact_flags": ("u1", 2, 3),
    "exact_counts": ("<u8", 2, 5),
    "channels": ("u1", 1, None),
}


class SummaryMembers(ABC):
    """How one summary collected beside the streaming histograms (the Rust ``collection::summary``; the
    registered ones in :mod:`histocal.state.file.summaries`) is stored in a state file: the zip members it writes, where they
    go in the file, the file-format version they need, how their sizes are bounded before they are read, and
    how they are written from and read back into a ``_core.StreamHistograms`` (whose ``restore_summary``
    checks what is read). The instances are registered in :mod:`histocal.state.file.summaries`; reading and
    writing handle every summary through it."""

    #: the Rust summary's name (``StreamHistograms(..., summaries=[name])``, ``export_summary``)
    summary: str
    #: its members: name -> (dtype, ndim, columns), as ``BASE_MEMBERS``
    members: ClassVar[dict[str, MemberSpec]]
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


def member_table(registry: Iterable[SummaryMembers]) -> dict[str, MemberSpec]:
    """Every member a file may hold, in the order a file holds them: ``BASE_MEMBERS`` with each registered
    summary's members after the member it names."""
    registry = tuple(registry)
    out: dict[str, MemberSpec] = {}
    for key, spec in BASE_MEMBERS.items():
        out[key] = spec
        for summary in registry:
            if summary.after == key:
                out.update(summary.members)
    return out
