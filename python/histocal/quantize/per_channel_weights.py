"""Whether ``per_channel=True`` can do what it says on a model: onnxruntime's quantizer writes
per-channel weights only for weights that are initializers, and writes them with DequantizeLinear's
``axis``, which opset 13 introduced. Below opset 13 it writes a model onnxruntime cannot load
("Unrecognized attribute: axis for operator DequantizeLinear"); weights held in Constant nodes are
quantized per tensor as activations, so the flag is silently a no-op. Every route (the Python API,
``histocal quantize``, diagnose, auto) refuses both, naming why, before any work; the recipe
(``recipe="best"``) prepares the model instead."""

from __future__ import annotations

from pathlib import Path

import onnx

from .preparation import PER_CHANNEL_OPSET, constant_weights

# The operators onnxruntime's QDQ quantizer gives per-channel weights (input 1).
PER_CHANNEL_OP_TYPES = ("Conv", "ConvTranspose", "Gemm", "MatMul")
_HOW = 'quantize with recipe="best" (histocal quantize --recipe best), which prepares the model, or without per_channel'


def check_per_channel_weights(
    model: onnx.ModelProto,
    quantizing_opset: int,
    op_types_to_quantize: list[str] | None,
    shown: str | Path = "the model",
) -> None:
    """ValueError when ``per_channel=True`` cannot give ``model`` per-channel weights.

    Args:
        model: the float model (its graph; external data not needed).
        quantizing_opset: the default-domain opset of the model onnxruntime quantizes (after its
            own conversion, if any).
        op_types_to_quantize: the operator types quantized (None: all).
        shown: the model as named in the message.

    Raises:
        ValueError: the opset is below 13, or weights of quantized per-channel operators are held
            in Constant nodes; the message names why and the nodes.
    """
    if quantizing_opset < PER_CHANNEL_OPSET:
        raise ValueError(
            f"per_channel=True: {shown} has opset {quantizing_opset}, and per-channel weights need opset "
            f"{PER_CHANNEL_OPSET} (DequantizeLinear's axis): onnxruntime would write a model it cannot load "
            f"('Unrecognized attribute: axis for operator DequantizeLinear'). Convert the model to opset "
            f"{PER_CHANNEL_OPSET} (onnx.version_converter), or {_HOW}"
        )
    op_types = [t for t in PER_CHANNEL_OP_TYPES if not op_types_to_quantize or t in op_types_to_quantize]
    held = constant_weights(model, op_types)
    if held:
        shown_nodes = ", ".join(repr(n) for n in held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        raise ValueError(
            f"per_channel=True: the weights of {len(held)} node(s) of {shown} are Constant nodes ({shown_nodes}): "
            "onnxruntime quantizes them per tensor, as activations, so per_channel would do nothing for them. "
            f"Turn the Constant nodes into initializers, or {_HOW}"
        )


__all__ = ["PER_CHANNEL_OP_TYPES", "check_per_channel_weights"]
