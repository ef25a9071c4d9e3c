"""Per-tensor method assignment: another method for chosen tensors, e.g. one for a classifier's
logits (PPQ's use of its order-preserving method) and percentile everywhere else.

A rule names its tensors by the tensor's name (``"name:logits"``) or by the op type of the node that
produces them (``"op:Gemm"``); a bare key is a calibrated tensor's name when there is one, else an op
type. Name rules win over op-type rules; the last of several op-type rules for one op type wins. Op
types come from the model graph, so op-type rules need the model (a calibrator has it; a state's
``compute`` is given it). A name that is not a calibrated tensor is an error (a typo would otherwise
be silently ignored); an op type that produces no calibrated tensor logs a warning.

Rules are given as a mapping ``{key: method}`` or ``{key: (method, {options})}``, or as ``"KEY=METHOD"``
strings (the CLI's ``--method-for``). The results of the assigned methods replace the main method's for
those tensors, in the same TensorsData (per channel too). A method needing data collected for it (its
summaries, ``methods.table.summaries_for``) needs it collected: the calibrators collect it when a rule asks.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import onnx
from onnxruntime.quantization.calibrate import TensorsData

from .. import methods
from ..io.models import load_model
from ..methods.table import summaries_for

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class MethodRule:
    """One rule: tensors named ``target`` (``by="name"``), produced by op type ``target`` (``"op"``),
    or either (``"any"``: a bare key), get ``method`` with ``options``."""

    by: str
    target: str
    method: str
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def key(self) -> str:
        return self.target if self.by == "any" else f"{self.by}:{self.target}"


def parse_method_overrides(value: Any) -> tuple[MethodRule, ...]:
    """The rules of ``value`` (see the module docstring); None or empty: none. ValueError names a bad rule."""
    if value is None:
        return ()
    if isinstance(value, tuple) and all(isinstance(r, MethodRule) for r in value):
        return value
    if isinstance(value, str):
        value = [value]
    if isinstance(value, Mapping):
        entries = list(value.items())
    elif isinstance(value, Sequence):
        entries = []
        for item in value:
            if not isinstance(item, str) or "=" not in item:
                raise ValueError(f"a method override is KEY=METHOD (e.g. op:Softmax=mse), got {item!r}")
            key, _, method = item.rpartition("=")
            entries.append((key, method))
    else:
        raise ValueError(f"method overrides must be a mapping {{key: method}} or KEY=METHOD strings, got {value!r}")
    rules = []
    for key, spec in entries:
        if not isinstance(key, str) or not key:
            raise ValueError(f"a method override's key must be a tensor name or op type, got {key!r}")
        by, sep, target = key.partition(":")
        if not sep or by not in ("name", "op"):
            by, target = "any", key
        if not target:
            raise ValueError(f"method override {key!r}: nothing after {by!r}:")
        method, options = spec if isinstance(spec, tuple) and len(spec) == 2 else (spec, {})
        try:
            name = methods.canonical_name(method)
        except ValueError as exc:
            raise ValueError(f"method override {key!r}: {exc}") from None
        if not isinstance(options, Mapping):
            raise ValueError(f"method override {key!r}: options must be a dict, got {options!r}")
        if name not in methods.ORT_METHODS:
            methods.check_options(name, dict(options))
        rules.append(MethodRule(by, target, name, tuple(sorted(options.items()))))
    return tuple(rules)


def rule_summaries(rules: Sequence[MethodRule]) -> frozenset[str]:
    """The summaries the rules' methods need collected beside the streaming histogram."""
    return frozenset().union(*(summaries_for(r.method, dict(r.options)) for r in rules))


def collection_mode(rules: Sequence[MethodRule], mode: str, mode_used: str | None) -> str:
    """The collection mode a calibrator set to ``mode`` (having used ``mode_used``) takes for ``rules``:
    streaming where a rule's method needs data collected beside the streaming histogram (its
    summaries); ValueError where exact mode was asked for or already used."""
    if not rule_summaries(rules) or mode == "streaming":
        return mode
    if mode == "exact" or mode_used == "exact":
        needing = sorted({r.method for r in rules if summaries_for(r.method, dict(r.options))})
        raise ValueError(
            f"method overrides using {', '.join(needing)} need the streaming collection "
            "(their data is collected beside the streaming histogram): use mode='streaming' or 'auto'"
        )
    return "streaming"


def producer_op_types(model: Any) -> dict[str, str]:
    """Each node output of ``model`` (a ModelProto or a path) and its node's op type (subgraphs' too)."""
    if not isinstance(model, onnx.ModelProto):
        model = load_model(model, load_external_data=False)
    out: dict[str, str] = {}

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            for o in node.output:
                out[o] = node.op_type
            for attr in node.attribute:
                for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    walk(g)

    walk(model.graph)
    return out


def assign_methods(
    rules: Sequence[MethodRule], names: Sequence[str], op_types: Mapping[str, str] | None
) -> dict[str, tuple[str, dict[str, Any]]]:
    """``{tensor: (method, options)}`` for the calibrated ``names`` the rules reach."""
    known = set(names)
    by_op: dict[str, MethodRule] = {}
    by_name: dict[str, MethodRule] = {}
    for r in rules:
        if r.by == "name" or (r.by == "any" and r.target in known):
            if r.target not in known:
                raise ValueError(f"method override {r.key!r}: {r.target!r} is not a calibrated tensor")
            by_name[r.target] = r
        else:
            if op_types is None:
                raise ValueError(
                    f"method override {r.key!r} names an op type (or a tensor that is not calibrated): "
                    "resolving op types needs the model (give model=)"
                )
            by_op[r.target] = r
    out = {}
    for name in names:
        rule = by_name.get(name) or (by_op.get(op_types.get(name, "")) if op_types is not None else None)
        if rule is not None:
            out[name] = (rule.method, dict(rule.options))
    reached = {op_types.get(n) for n in names} if op_types is not None else set()
    for op, r in by_op.items():
        if op not in reached:
            logger.warning(
                "method override %r: no calibrated tensor is produced by a %s node (nor named %r)", r.key, op, op
            )
    return out


def compute_with_overrides(
    state: Any,
    method: Any,
    method_overrides: Any = None,
    *,
    model: Any = None,
    base: TensorsData | None = None,
    per_channel: bool | None = None,
    **settings: Any,
) -> TensorsData:
    """``state.compute(method, **settings)``, with the tensors the rules reach computed by their own methods.

    Args:
        state: the ``CalibrationState`` to compute from.
        method: the main method (ORT's enum, or any method name).
        method_overrides: rules ``{"name:TENSOR" or "op:OPTYPE" or a bare key: method or
            (method, options)}``, or ``KEY=METHOD`` strings; a bare key is a tensor name, else
            an op type (docs/methods.md).
        model: the model (ModelProto or path), needed for op-type rules.
        base: the main method's result, already computed (then not computed again).
        per_channel: per-channel results (default: when the state holds per-channel histograms).
        **settings: the main method's settings, as ``CalibrationState.compute`` takes them.

    Returns:
        onnxruntime ``TensorsData``: the main method's ranges, replaced for the rules' tensors.

    Raises:
        ValueError: a malformed rule, an unknown method, a name that is not a calibrated tensor,
            or an op-type rule without ``model``.
    """
    rules = parse_method_overrides(method_overrides)
    result = base if base is not None else state.compute(method, per_channel=per_channel, **settings)
    if not rules:
        return result
    op_types = producer_op_types(model) if model is not None else None
    assigned = assign_methods(rules, state.names, op_types)
    groups: dict[tuple[str, tuple[tuple[str, Any], ...]], list[str]] = {}
    for tensor, (m, options) in assigned.items():
        groups.setdefault((m, tuple(sorted(options.items()))), []).append(tensor)
    data = dict(result.data)
    for (m, frozen), tensors in groups.items():
        logger.info("method %s for %d tensor(s): %s", m, len(tensors), ", ".join(map(repr, tensors)))
        sub = dataclasses.replace(state, collection=state.collection.subset(tensors))
        if sub.method != m:
            sub = dataclasses.replace(sub, method=None, settings={})  # the collection's settings are for its method
        part = sub.compute(m, per_channel=per_channel, **dict(frozen))
        for t in tensors:
            data[t] = part.data[t]
    return TensorsData(result.calibration_method, data)
