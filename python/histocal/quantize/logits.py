"""The model the recipe scores candidates on where its outputs saturate: each graph output a
Softmax or Sigmoid computes is replaced by that operator's input (the pre-activation logits).
A saturated probability (0.9999 against 0.99999) hides what quantization does to the logits
before it, so auto scored on the probabilities keeps whatever clips least; on the logits the
candidates' differences show (docs/methods.md, "recipe")."""

from __future__ import annotations

import onnx

SATURATING_HEADS = ("Softmax", "Sigmoid")


def logits_model(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``model`` with every output of a Softmax or Sigmoid replaced by the node's input (the node
    dropped when nothing else reads it); None when no output comes from such a node."""
    producer = {out: node for node in model.graph.node for out in node.output}
    readers = {name for node in model.graph.node for name in node.input}
    heads = {
        o.name: producer[o.name]
        for o in model.graph.output
        if o.name in producer
        and producer[o.name].op_type in SATURATING_HEADS
        and producer[o.name].domain in ("", "ai.onnx")
    }
    if not heads:
        return None
    scored = onnx.ModelProto()
    scored.CopyFrom(model)
    outputs, names = [], set()
    for output in model.graph.output:
        head = heads.get(output.name)
        if head is None:
            info = output
        else:
            info = onnx.helper.make_tensor_value_info(head.input[0], output.type.tensor_type.elem_type, None)
        if info.name not in names:
            outputs.append(info)
            names.add(info.name)
    dropped = {name for name in heads if name not in readers}  # head outputs nothing else reads
    kept = [n for n in model.graph.node if not (n.op_type in SATURATING_HEADS and n.output[0] in dropped)]
    scored.graph.ClearField("node")
    scored.graph.node.extend(kept)
    scored.graph.ClearField("output")
    scored.graph.output.extend(outputs)
    return scored


__all__ = ["SATURATING_HEADS", "logits_model"]
