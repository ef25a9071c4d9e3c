"""auto's model-level candidates from one calibration state, each shared computation done once.

The per-tensor estimate (``state.auto.auto_ranges``) computes minmax, percentile, ORT
entropy, kl and mse itself, and several of them are model-level candidates of their own with the
same options: computed one after the other through ``CalibrationState.compute``, the costliest
(entropy, kl, mse) ran twice per state. ``CandidateMemo`` routes every candidate of one state
through one memo: ORT methods by (method, settings) through ``state.compute``, histocal methods by
(method, tensors, options) on the state's streaming histogram. Every call is one the state would
make itself with the same arguments, so each candidate equals ``state.compute(method, **options)``
(tests/quantize/test_candidate_memo.py checks them value for value); computed for some tensors
only (``LazyCandidates.restricted``), each tensor's ranges are still its own histogram's, the
state's for that tensor.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

from .. import methods
from ..methods.table import TABLE
from ..state import merge_states
from ..state.auto import ORT_AUTO_CANDIDATES, auto_ranges
from ..state.results import StreamingPart, results_of
from .rule import ALL_DATA_CANDIDATES

logger = logging.getLogger(__name__)


class _MemoStream:
    """A streaming histogram whose ``ranges`` results are kept by their arguments."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._ranges: dict[tuple, list[tuple[float, float]]] = {}

    def ranges(self, method: str, names: list[str], **options: Any) -> list[tuple[float, float]]:
        # Keyed by the options the kernel applies, the method table's defaults included (kl is
        # asked with them spelled out as a candidate and without them inside the per-tensor estimate).
        table = TABLE.get(method)
        given = {**(table.defaults if table is not None else {}), **options}
        key = (method, tuple(names), tuple(sorted((k, repr(v)) for k, v in given.items())))
        if key not in self._ranges:
            self._ranges[key] = list(self._stream.ranges(method, names, **options))
        return self._ranges[key]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class CandidateMemo:
    """``state.compute(method, **options)`` for one state, each shared part computed once over
    every call (``candidate_ranges``); only for ``names`` if given, where the state holds
    streaming histograms only (``results.StreamingPart``: each tensor's ranges are its own
    histogram's, so they are the state's own for those tensors; otherwise every tensor). A per-channel state or one
    without its streaming histogram is computed request by request."""

    def __init__(self, state: Any, names: Collection[str] | None = None) -> None:
        if names is not None and state.exact is None and state.channels is None and state.stream is not None:
            wanted = set(names)
            state = StreamingPart([n for n in state.names if n in wanted], state.stream, state.method, state.settings)
        self.state = state
        self._ort: dict[tuple, TensorsData] = {}
        self._stream = None if state.stream is None else _MemoStream(state.stream)
        self._names = list(state.names)

    def ranges(self, method: str, options: Mapping[str, Any]) -> TensorsData | ValueError:
        """``state.compute(method, **options)``, or the ValueError it raises."""
        state = self.state
        if state.channels is not None or self._stream is None:
            return _compute(lambda: state.compute(method, **options))
        name = methods.canonical_name(method)
        if name in methods.ORT_METHODS:
            return _compute(lambda: self._ort_ranges(name, dict(options)))
        return _compute(lambda: self._histocal_ranges(name, dict(options)))

    def _ort_ranges(self, method: str, settings: dict[str, Any]) -> TensorsData:
        key = (method, tuple(sorted((k, repr(v)) for k, v in settings.items())))
        if key not in self._ort:
            self._ort[key] = results_of(self.state, method, False, settings)
        return self._ort[key]

    def _histocal_ranges(self, name: str, options: dict[str, Any]) -> TensorsData:
        state, names = self.state, self._names
        if name == state.method:  # as CalibrationState.method_ranges: the state's settings first
            allowed = methods.METHOD_OPTIONS.get(name, ())
            options = {**{k: state.settings[k] for k in allowed if k in state.settings}, **options}
        options = methods.check_options(name, options)
        if name == "auto":
            ort = {label: self._ort_ranges(m, dict(settings)) for label, m, settings in ORT_AUTO_CANDIDATES}
            pairs, _ = auto_ranges(self._stream, names, options, ort)
        else:
            pairs = methods.ranges(self._stream, names, name, options)
        return methods.to_tensors_data(names, pairs, {n: state.dtype(n) for n in names})


def candidate_ranges(state: Any, requests: Sequence[tuple[str, dict[str, Any]]]) -> list[TensorsData | ValueError]:
    """Per (method, options) of ``requests``, ``state.compute(method, **options)`` (or the
    ValueError it raises), each shared part computed once (``CandidateMemo``)."""
    memo = CandidateMemo(state)
    return [memo.ranges(method, options) for method, options in requests]


def _compute(fn: Any) -> TensorsData | ValueError:
    try:
        return fn()
    except ValueError as exc:
        return exc


def state_candidates(
    state: Any, qtype: str, symmetric: bool, labels: Collection[str] | None = None
) -> dict[str, TensorsData]:
    """auto's model-level candidates (``methods.MODEL_AUTO_CANDIDATES``, with this qtype and
    symmetry) computed from one ``CalibrationState``, by label, in tie-breaking order (only those
    of ``labels``, if given). Each is a MinMax-style TensorsData (lowest/highest only), the way
    auto's ranges travel through ORT and its cache whichever candidate wins. A candidate the state
    cannot give (pow2 without clipping on a tensor whose range needs a scale its type cannot hold,
    such as a -3.4e38 attention-mask sentinel) is left out with a warning: the others can still
    be chosen.

    Args:
        state: the ``CalibrationState``.
        qtype: the activations' quantized type (e.g. ``"int8"``).
        symmetric: symmetric activation ranges.
        labels: the candidates wanted (None: every one).

    Returns:
        The candidates' ranges by label.
    """
    out = {}
    for label, td in _candidates(state, qtype, symmetric, labels).items():
        if isinstance(td, ValueError):
            logger.warning("auto: candidate %r left out: %s", label, td)
            continue
        out[label] = td
    return out


def _candidates(
    state: Any, qtype: str, symmetric: bool, labels: Collection[str] | None, memo: CandidateMemo | None = None
) -> dict[str, TensorsData | ValueError]:
    """``state_candidates``' ranges (through ``memo``, the state's, if given), or the ValueError
    that says why the state cannot give one."""
    requested = [r for r in methods.model_candidate_options(qtype, symmetric) if labels is None or r[0] in labels]
    if memo is None:
        computed = candidate_ranges(state, [(method, options) for _, method, options in requested])
    else:
        computed = [memo.ranges(method, options) for _, method, options in requested]
    return {
        label: td
        if isinstance(td, ValueError)
        else TensorsData(
            CalibrationMethod.MinMax,
            {name: TensorData(lowest=d.lowest, highest=d.highest) for name, d in td.data.items()},
        )
        for (label, _, _), td in zip(requested, computed)
    }


class LazyCandidates(Mapping[str, TensorsData]):
    """auto's candidates under the given labels from the merge of some calibration states, each
    computed when first asked for (the states merged then): cross-validation needs the all-data
    ranges of ``ALL_DATA_CANDIDATES``, of the candidates the rule compares by width and of the one
    chosen, not of every candidate, and a fold's ranges only of the candidates still scored on it
    (one that can no longer qualify is not: on a YOLOv8 detector, most of the entropy and kl
    candidates' per-fold histogram searches). ``shared``: candidates taken from it instead (a
    fold's ``ALL_DATA_CANDIDATES``, the all-data ones). A candidate the data cannot give raises the
    ValueError that says why."""

    def __init__(
        self,
        states: Sequence[Any] | _Merged,
        qtype: str,
        symmetric: bool,
        labels: Sequence[str],
        shared: Mapping[str, TensorsData] | None = None,
        names: Collection[str] | None = None,
    ) -> None:
        self._merged = states if isinstance(states, _Merged) else _Merged(states)
        self._names = names
        self._memo: CandidateMemo | None = None
        self._qtype = qtype
        self._symmetric = symmetric
        self._labels = list(labels)
        self._shared = shared if shared is not None else {}
        self._computed: dict[str, TensorsData] = {}

    def restricted(self, names: Collection[str]) -> LazyCandidates:
        """The same candidates computed only for the tensors ``names`` (those a placement quantizes:
        the recipe's chosen one reads a third of MiniLM's), on the same merged state, where the
        state allows it (``CandidateMemo``). The ``ALL_DATA_CANDIDATES`` keep every tensor, as
        computed: the scorer built on them is the placement pass's, and ``rule.range_widths``
        compares candidates on the tensors they share."""
        return LazyCandidates(
            self._merged,
            self._qtype,
            self._symmetric,
            self._labels,
            self._shared if self._shared else _AllData(self),
            names,
        )

    def _state_memo(self) -> CandidateMemo:
        """The merged state's memo: what candidates share (the per-tensor estimate computes
        entropy, kl and mse itself) is computed once whichever is asked for first."""
        if self._memo is None:
            self._memo = CandidateMemo(self._merged.state, self._names)
        return self._memo

    def __getitem__(self, label: str) -> TensorsData:
        if label not in self._labels:
            raise KeyError(label)
        if label in self._shared:
            return self._shared[label]
        if label not in self._computed:
            memo = self._state_memo()
            got = _candidates(memo.state, self._qtype, self._symmetric, [label], memo)[label]
            if isinstance(got, ValueError):
                raise got
            self._computed[label] = got
        return self._computed[label]

    def __contains__(self, label: object) -> bool:  # without computing it
        return label in self._labels

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)


def cross_validation_candidates(
    rest: Any, fold_states: Sequence[Any], qtype: str, symmetric: bool
) -> tuple[LazyCandidates, list[LazyCandidates]]:
    """auto's candidates from all the calibration data (``rest``, the state of the feeds in no
    fold, or None, and every fold's state) and, per fold, from all the data but that fold's feeds,
    each computed when asked for (``LazyCandidates``: one a fold cannot give raises ValueError
    there, and ``selection.select`` leaves it out). ``ALL_DATA_CANDIDATES`` are scored with their
    ranges from all the data in every fold (a range that only grows with the data, fitted on a
    fold's fewer feeds, clips what the final ranges would not, and cross-validation would
    underrate it), so they are not computed per fold."""
    everything = [label for label, _, _ in methods.model_candidate_options(qtype, symmetric)]
    candidates = LazyCandidates([rest, *fold_states], qtype, symmetric, everything)
    shared = _AllData(candidates)
    folds = [
        LazyCandidates([rest, *fold_states[:k], *fold_states[k + 1 :]], qtype, symmetric, everything, shared)
        for k in range(len(fold_states))
    ]
    return candidates, folds


class _Merged:
    """Calibration states merged when first needed (``merge_states``), once for every view."""

    def __init__(self, states: Sequence[Any]) -> None:
        self._states = [s for s in states if s is not None]
        self._state: Any = None

    @property
    def state(self) -> Any:
        if self._state is None:
            self._state = merge_states(*self._states)
        return self._state


class _AllData(Mapping[str, TensorsData]):
    """The all-data candidates of ``ALL_DATA_CANDIDATES``, as every fold scores them."""

    def __init__(self, candidates: LazyCandidates) -> None:
        self._candidates = candidates

    def __getitem__(self, label: str) -> TensorsData:
        if label not in ALL_DATA_CANDIDATES:
            raise KeyError(label)
        return self._candidates[label]

    def __contains__(self, label: object) -> bool:
        return label in ALL_DATA_CANDIDATES and label in self._candidates

    def __iter__(self) -> Iterator[str]:
        return (label for label in self._candidates if label in ALL_DATA_CANDIDATES)

    def __len__(self) -> int:
        return sum(1 for _ in self)
