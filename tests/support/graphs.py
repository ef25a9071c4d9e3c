"""The one ONNX graph builder of the tests (tests/support/models.py) and the benchmarks (benches/).

Every model it builds is ORT-loadable: IR version 10 (onnxruntime 1.31 refuses the IR 14 that
onnx 1.23 writes by default) and an explicit default-domain opset, checked by onnx's checker.
Nodes and constants named by the caller keep their names; the others are numbered in the order
they are added (``<prefix>_<n>`` for node outputs, ``<prefix><n>`` for constants), so a seeded
builder makes the same model every time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32, F16, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64


def tensor(name: str, shape: Sequence[int | str], elem_type: int = F32) -> onnx.ValueInfoProto:
    """A graph input or output: name, element type and shape (str dims are symbolic)."""
    return helper.make_tensor_value_info(name, elem_type, list(shape))


class GraphBuilder:
    """Appends nodes and constants (initializers) to one graph; ``rng`` draws its weights."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0
        self._relu6: tuple[str, str] | None = None

    def const(self, arr: Any, name: str | None = None, *, prefix: str = "c") -> str:
        """A constant holding ``arr`` as is (its numpy dtype); named ``name`` or numbered."""
        if name is None:
            self.n += 1
            name = f"{prefix}{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(
        self,
        op: str,
        inputs: Sequence[str],
        prefix: str | None = None,
        *,
        output: str | None = None,
        name: str | None = None,
        **attrs: Any,
    ) -> str:
        """One node with one output; returns the output's name. Without ``output`` the output is
        numbered (``<prefix or op>_<n>``) and the node named ``<op>_<n>``."""
        if output is None:
            self.n += 1
            output = f"{prefix or op.lower()}_{self.n}"
            name = name or f"{op}_{self.n}"
        self.nodes.append(helper.make_node(op, list(inputs), [output], name=name, **attrs))
        return output

    def model(
        self, name: str, inputs: Sequence[onnx.ValueInfoProto], outputs: Sequence[onnx.ValueInfoProto], opset: int = 17
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, list(inputs), list(outputs), initializer=self.inits)
        model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", opset)])
        onnx.checker.check_model(model)
        return model

    # ------------------------------------------------------------------------------ CNN pieces

    def conv(
        self,
        x: str,
        cin: int,
        cout: int,
        k: int = 3,
        stride: int = 1,
        group: int = 1,
        act: str | None = "relu",
        gain: float = 1.0,
    ) -> str:
        """Conv with He-initialised weights (times ``gain``) and a folded-BatchNorm bias, then
        ``act``: "relu", "relu6" (Clip 0..6) or None."""
        fan_in = cin // group * k * k
        w = self.rng.standard_normal((cout, cin // group, k, k)) * gain * np.sqrt(2.0 / fan_in)
        b = self.rng.normal(0.0, 0.1, cout)
        p = k // 2
        grouped = {"group": group} if group != 1 else {}  # ONNX's default group is 1
        y = self.node(
            "Conv",
            [x, self.const(w.astype(np.float32), prefix="w"), self.const(b.astype(np.float32), prefix="b")],
            "conv",
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[p, p, p, p],
            **grouped,
        )
        if act == "relu":
            return self.node("Relu", [y], "relu")
        if act == "relu6":
            if self._relu6 is None:
                self._relu6 = (
                    self.const(np.array(0.0, np.float32), "relu6_lo"),
                    self.const(np.array(6.0, np.float32), "relu6_hi"),
                )
            return self.node("Clip", [y, *self._relu6], "relu6")
        assert act is None, act
        return y

    def basic_block(self, x: str, cin: int, cout: int, stride: int = 1, gain: float = 0.3) -> str:
        """ResNet basic block: conv-relu-conv (+ projection shortcut) -> Add -> Relu."""
        y = self.conv(x, cin, cout, 3, stride)
        y = self.conv(y, cout, cout, 3, 1, act=None, gain=gain)
        skip = x if stride == 1 and cin == cout else self.conv(x, cin, cout, 1, stride, act=None)
        return self.node("Relu", [self.node("Add", [y, skip], "add")], "relu")

    def inverted_residual(self, x: str, cin: int, cout: int, stride: int, expand: int) -> str:
        """MobileNetV2 block: 1x1 expand (Relu6), 3x3 depthwise (Relu6), 1x1 project (+ Add)."""
        mid = cin * expand
        y = self.conv(x, cin, mid, 1, act="relu6")
        y = self.conv(y, mid, mid, 3, stride, group=mid, act="relu6")
        y = self.conv(y, mid, cout, 1, act=None, gain=0.3 if stride == 1 and cin == cout else 1.0)
        return self.node("Add", [y, x], "add") if stride == 1 and cin == cout else y

    # ---------------------------------------------------------------------- transformer pieces

    def linear(self, x: str, din: int, dout: int, gain: float = 1.0, rows: np.ndarray | None = None) -> str:
        """MatMul by a [din, dout] weight (rows scaled by ``rows`` if given) plus a bias."""
        w = self.rng.standard_normal((din, dout)) * gain / np.sqrt(din)
        if rows is not None:
            w = w * rows[:, None]
        y = self.node("MatMul", [x, self.const(w.astype(np.float32), prefix="w")], "matmul")
        return self.node("Add", [y, self.const(self.rng.normal(0, 0.02, dout).astype(np.float32), prefix="b")], "bias")

    def layernorm(self, x: str, d: int) -> str:
        gamma = (1 + 0.1 * self.rng.standard_normal(d)).astype(np.float32)
        beta = (0.05 * self.rng.standard_normal(d)).astype(np.float32)
        return self.node(
            "LayerNormalization",
            [x, self.const(gamma, prefix="g"), self.const(beta, prefix="beta")],
            "ln",
            axis=-1,
            epsilon=1e-5,
        )
