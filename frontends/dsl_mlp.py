"""The DSL's dense MLPs (part of ``frontends.dsl.Layer``): SwiGLU, GeGLU, GELU with biases
(GPT-2), the ReLU MLP (OPT) and the squared-ReLU MLP (Nemotron-H), with weights
``layers.{i}.mlp.*`` and the model's ``mlp``/``d_ff`` meta entries."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from frontends.dsl_args import one_of, positive

if TYPE_CHECKING:
    from frontends.dsl_core import Model, Tensor


class MlpLayer:
    """Mixin: needs the layer's ``model`` and ``prefix`` (``layers.{i}.``)."""

    model: Model
    prefix: str

    def _note_mlp(self, kind: str, d_ff: int) -> None:
        meta = self.model.meta
        if meta["mlp"] is None:
            meta["mlp"], meta["d_ff"] = kind, d_ff

    def _gated(self, op: str, x: Tensor, d_ff: int, attrs: Optional[dict]) -> Tensor:
        m, p = self.model, self.prefix
        d = m._features(x)
        positive("d_ff", d_ff, m.origin())
        w_gate = m.param(f"{p}mlp.w_gate", (d_ff, d))
        w_up = m.param(f"{p}mlp.w_up", (d_ff, d))
        w_down = m.param(f"{p}mlp.w_down", (d, d_ff))
        self._note_mlp(op, d_ff)
        return m.emit(op, [x, w_gate, w_up, w_down], attrs, f"{p}mlp_out")[0]

    def swiglu(self, x: Tensor, d_ff: int) -> Tensor:
        """down(silu(gate(x)) * up(x)) with ``mlp.w_gate/w_up`` [d_ff, d], ``mlp.w_down`` [d, d_ff]."""
        return self._gated("swiglu", x, d_ff, None)

    def geglu(self, x: Tensor, d_ff: int, approximate: str = "tanh") -> Tensor:
        """down(gelu(gate(x)) * up(x)); approximate "tanh" is gelu_pytorch_tanh (Gemma)."""
        one_of("approximate", approximate, ("tanh", "none"), self.model.origin())
        return self._gated("geglu", x, d_ff, {"approximate": approximate})

    def _up_down(self, x: Tensor, d_ff: int, bias: bool) -> tuple:
        """The weights of an ungated MLP: ``mlp.w_up`` [d_ff, d], ``mlp.w_down`` [d, d_ff] and,
        with ``bias``, ``mlp.b_up`` / ``mlp.b_down`` (else None)."""
        m, p = self.model, self.prefix
        d = m._features(x)
        positive("d_ff", d_ff, m.origin())
        w_up = m.param(f"{p}mlp.w_up", (d_ff, d))
        w_down = m.param(f"{p}mlp.w_down", (d, d_ff))
        b_up = m.param(f"{p}mlp.b_up", (d_ff,)) if bias else None
        b_down = m.param(f"{p}mlp.b_down", (d,)) if bias else None
        return w_up, w_down, b_up, b_down

    def relu_mlp(self, x: Tensor, d_ff: int, bias: bool = False) -> Tensor:
        """down(relu(up(x) + b_up)) + b_down (OPT's fc1 / fc2), as primitives; weights
        ``mlp.w_up`` [d_ff, d], ``mlp.w_down`` [d, d_ff] (biases ``b_up``, ``b_down``)."""
        return self._relu_mlp(x, d_ff, bias, squared=False)

    def relu2_mlp(self, x: Tensor, d_ff: int, bias: bool = False) -> Tensor:
        """down(relu(up(x) + b_up)^2) + b_down (Nemotron-H's squared-ReLU MLP), as primitives;
        weights ``mlp.w_up`` [d_ff, d], ``mlp.w_down`` [d, d_ff] (biases ``b_up``, ``b_down``)."""
        return self._relu_mlp(x, d_ff, bias, squared=True)

    def _relu_mlp(self, x: Tensor, d_ff: int, bias: bool, squared: bool) -> Tensor:
        m, p = self.model, self.prefix
        w_up, w_down, b_up, b_down = self._up_down(x, d_ff, bias)
        self._note_mlp("relu2" if squared else "relu", d_ff)
        up = m.emit("linear", [x, w_up, b_up], None, f"{p}mlp_up")[0]
        zero = m.emit("constant", [], {"value": 0.0}, f"{p}mlp_zero")[0]
        act = m.emit("maximum", [up, zero], None, f"{p}mlp_relu" if squared else f"{p}mlp_act")[0]
        if squared:
            act = m.emit("mul", [act, act], None, f"{p}mlp_act")[0]
        return m.emit("linear", [act, w_down, b_down], None, f"{p}mlp_out")[0]

    def gelu_mlp(self, x: Tensor, d_ff: int, bias: bool = False, approximate: str = "none") -> Tensor:
        """down(gelu(up(x) + b_up)) + b_down (GPT-2 style)."""
        m, p = self.model, self.prefix
        one_of("approximate", approximate, ("tanh", "none"), m.origin())
        w_up, w_down, b_up, b_down = self._up_down(x, d_ff, bias)
        self._note_mlp("gelu", d_ff)
        return m.emit("gelu_mlp", [x, w_up, w_down, b_up, b_down], {"approximate": approximate}, f"{p}mlp_out")[0]
