"""The quantization arguments of the commands that quantize (quantize, diagnose): the choices
the parser offers and the onnxruntime ``quantize_static`` keywords they become."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..quantize.ort import QuantizationArgs

QUANT_TYPES = ("qint8", "quint8", "qint16", "quint16", "qint4", "quint4", "qfloat8e4m3fn")
FORMATS = ("qdq", "qoperator")


def quant_type(name: str) -> Any:
    from onnxruntime.quantization import QuantType

    members = {m.lower(): m for m in QuantType.__members__}
    return QuantType[members[name]]


def quantization_arguments(args: argparse.Namespace) -> QuantizationArgs:
    """quantize_static's quantization arguments from the command line (also those auto's
    model-level choice quantizes its candidates with)."""
    from onnxruntime.quantization import QuantFormat

    from ..quantize.ort import QuantizationArgs

    extra_options = {}
    if args.symmetric_activations is not None:
        extra_options["ActivationSymmetric"] = args.symmetric_activations
    if args.symmetric_weights is not None:
        extra_options["WeightSymmetric"] = args.symmetric_weights
    return QuantizationArgs(
        quant_format=QuantFormat.QDQ if args.format == "qdq" else QuantFormat.QOperator,
        op_types_to_quantize=args.op_types,
        per_channel=args.per_channel,
        reduce_range=args.reduce_range,
        activation_type=quant_type(args.activation_type),
        weight_type=quant_type(args.weight_type),
        nodes_to_quantize=args.nodes_to_quantize,
        nodes_to_exclude=args.nodes_to_exclude,
        use_external_data_format=args.external_data,
        calibration_providers=args.providers,
        extra_options=extra_options,
    )


def add_quantization_options(p: argparse.ArgumentParser) -> None:
    """quantize_static's quantization arguments (quantize, diagnose)."""
    g = p.add_argument_group("quantization")
    g.add_argument("--format", choices=FORMATS, default="qdq", help="QDQ or QOperator model (default qdq)")
    g.add_argument("--per-channel", action="store_true", help="quantize weights per channel")
    g.add_argument(
        "--activation-type",
        choices=QUANT_TYPES,
        type=str.lower,
        default="qint8",
        help="activation type (default qint8)",
    )
    g.add_argument(
        "--weight-type", choices=QUANT_TYPES, type=str.lower, default="qint8", help="weight type (default qint8)"
    )
    g.add_argument("--reduce-range", action="store_true", help="7-bit weights (for older CPUs)")
    g.add_argument(
        "--symmetric-activations",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ORT extra option ActivationSymmetric",
    )
    g.add_argument(
        "--symmetric-weights",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ORT extra option WeightSymmetric",
    )
    g.add_argument("--nodes-to-quantize", nargs="+", metavar="NODE", help="quantize only these nodes")
    g.add_argument("--nodes-to-exclude", nargs="+", metavar="NODE", help="do not quantize these nodes")
    g.add_argument(
        "--external-data",
        action="store_true",
        help="write the weights as external data (quantize: OUTPUT.data beside OUTPUT)",
    )
