"""auto's model-level candidates from one calibration state, each shared computation done once.

The per-tensor estimate (``state.auto.auto_ranges``) computes minmax, percentile, ORT
entropy, kl and mse itself, and several of them are model-level candidates of their own with the
same options: computed one after the other through ``CalibrationState.compute``, the costliest
(entropy, kl, mse) ran twice per state. ``candidate_ranges`` routes every candidate through one
memo: ORT methods by (method, settings) through ``state.compute``, histocal methods by
(method, tensors, options) on the state's streaming histogram. Every call is one the state would
make itself with the same arguments, so each candidate equals ``state.compute(method, **options)``
(tests/test_selection.py checks them value for value).
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


def candidate_ranges(state: Any, requests: Sequence[tuple[str, dict[str, Any]]]) -> list[TensorsData | ValueError]:
    """Per (method, options) of ``requests``, ``state.compute(method, **options)`` (or the
    ValueError it raises), each shared part computed once. A per-channel state or one without
    its streaming histogram is computed request by request."""
    if state.channels is not None or state.stream is None:
        return [_compute(lambda m=m, o=o: state.compute(m, **o)) for m, o in requests]
    ort: dict[tuple, TensorsData] = {}

    def ort_ranges(method: str, settings: dict[str, Any]) -> TensorsData:
        key = (method, tuple(sorted((k, repr(v)) for k, v in settings.items())))
        if key not in ort:
            ort[key] = state.compute(method, per_channel=False, **settings)
        return ort[key]

    stream = _MemoStream(state.stream)
    names = list(state.names)
    dtypes = {n: state.dtype(n) for n in names}

    def histocal_ranges(name: str, options: dict[str, Any]) -> TensorsData:
        if name == state.method:  # as CalibrationState.method_ranges: the state's settings first
            allowed = methods.METHOD_OPTIONS.get(name, ())
            options = {**{k: state.settings[k] for k in allowed if k in state.settings}, **options}
        options = methods.check_options(name, options)
        if name == "auto":
            ort = {label: ort_ranges(m, dict(settings)) for label, m, settings in ORT_AUTO_CANDIDATES}
            pairs, _ = auto_ranges(stream, names, options, ort)
        else:
            pairs = methods.ranges(stream, names, name, options)
        return methods.to_tensors_data(names, pairs, dtypes)

    out: list[TensorsData | ValueError] = []
    for method, options in requests:
        name = methods.canonical_name(method)
        if name in methods.ORT_METHODS:
            out.append(_compute(lambda n=name, o=options: ort_ranges(n, dict(o))))
        else:
            out.append(_compute(lambda n=name, o=options: histocal_ranges(n, dict(o))))
    return out


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
    requested = [r for r in methods.model_candidate_options(qtype, symmetric) if labels is None or r[0] in labels]
    computed = candidate_ranges(state, [(method, options) for _, method, options in requested])
    for (label, _, _), td in zip(requested, computed):
        if isinstance(td, ValueError):
            logger.warning("auto: candidate %r left out: %s", label, td)
            continue
        out[label] = TensorsData(
            CalibrationMethod.MinMax,
            {name: TensorData(lowest=d.lowest, highest=d.highest) for name, d in td.data.items()},
        )
    return out


class LazyCandidates(Mapping[str, TensorsData]):
    """auto's candidates of one state under the given labels, each computed when first asked
    for: cross-validation needs the all-data ranges of ``ALL_DATA_CANDIDATES``, of the candidates
    the rule compares by width and of the one chosen, not of every candidate. A candidate the
    state cannot give raises the ValueError that says why."""

    def __init__(
        self,
        state: Any,
        qtype: str,
        symmetric: bool,
        labels: Sequence[str],
        computed: Mapping[str, TensorsData] | None = None,
    ) -> None:
        self._state = state
        self._qtype = qtype
        self._symmetric = symmetric
        self._labels = list(labels)
        self._computed = {label: td for label, td in (computed or {}).items() if label in self._labels}

    def __getitem__(self, label: str) -> TensorsData:
        if label not in self._labels:
            raise KeyError(label)
        if label not in self._computed:
            got = state_candidates(self._state, self._qtype, self._symmetric, [label])
            if label not in got:
                raise ValueError(f"auto: candidate {label!r} cannot be computed from all the calibration data")
            self._computed[label] = got[label]
        return self._computed[label]

    def __contains__(self, label: object) -> bool:  # without computing it
        return label in self._labels

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)


def cross_validation_candidates(
    rest: Any, fold_states: Sequence[Any], qtype: str, symmetric: bool
) -> tuple[LazyCandidates, list[dict[str, TensorsData]]]:
    """auto's candidates from all the calibration data (``rest``, the state of the feeds in no
    fold, or None, and every fold's state; computed when asked for) and, per fold, from all the
    data but that fold's feeds: only the candidates every fold can give. ``ALL_DATA_CANDIDATES``
    are scored with their ranges from all the data in every fold (a range that only grows with
    the data, fitted on a fold's fewer feeds, clips what the final ranges would not, and
    cross-validation would underrate it), so they are not computed per fold."""
    states = [s for s in (rest, *fold_states) if s is not None]
    everything = [label for label, _, _ in methods.model_candidate_options(qtype, symmetric)]
    per_fold = [label for label in everything if label not in ALL_DATA_CANDIDATES]
    folds = []
    for k in range(len(fold_states)):
        others = [rest, *fold_states[:k], *fold_states[k + 1 :]]
        folds.append(state_candidates(merge_states(*[s for s in others if s is not None]), qtype, symmetric, per_fold))
    full_state = merge_states(*states)
    full = state_candidates(
        full_state, qtype, symmetric, [label for label in everything if label in ALL_DATA_CANDIDATES]
    )
    common = [
        label
        for label in everything
        if (label in full if label in ALL_DATA_CANDIDATES else all(label in f for f in folds))
    ]
    candidates = LazyCandidates(full_state, qtype, symmetric, common, full)
    fold_candidates = [
        {label: full[label] if label in ALL_DATA_CANDIDATES else fold[label] for label in common} for fold in folds
    ]
    return candidates, fold_candidates
