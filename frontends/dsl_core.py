"""The DSL's core (``frontends.dsl`` says how a model reads): ``Tensor``, and ``Model``'s own
methods (graph, params, inputs, elementwise ops, norms, the LM head) that every layer module
builds on. ``frontends.dsl.Model`` is this class with the layers and the encoder and vision
methods mixed in; the layer modules import from here, so that none of them imports
``frontends.dsl``."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

from irc import build, dims
from irc.dtypes import DType
from irc.errors import ShapeError, SpecError
from irc.graph import Graph, Param, Value
from irc.limits import LimitError, check_nodes
from frontends.dsl_args import ArgError, call_site, one_of, positive, positive_float

ACTIVATION = DType.f32
PAST = "P"
TOTAL = dims.add("P", "T")

class Tensor:
    """A graph value in the builder; ``a + b`` adds (named after the residual stream)."""

    __slots__ = ("model", "value")

    def __init__(self, model: "Model", value: Value):
        self.model, self.value = model, value

    @property
    def shape(self) -> tuple:
        return self.value.shape

    @property
    def dtype(self) -> DType:
        return self.value.dtype

    @property
    def name(self) -> str:
        return self.value.name

    def __add__(self, other: "Tensor") -> "Tensor":
        return self.model.add(self, other)

    def __mul__(self, other) -> "Tensor":
        """Elementwise product with a tensor, or ``model.scale`` by a number."""
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return self.model.scale(self, other)
        return self.model.mul(self, other)

    def __repr__(self) -> str:
        return f"Tensor({self.value!r})"


class Model:
    """The builder's core: its graph, params, inputs, elementwise ops, norms and the LM head
    (``frontends.dsl.Model`` adds the layers and the encoder and vision methods)."""

    def __init__(self, name: str, vocab: int, d_model: int, dtype: str = "f32", encoder: bool = False):
        if not isinstance(name, str) or not name:
            raise ArgError("name", f"expected a non-empty string, got {name!r}", call_site())
        # a vision encoder (frontends.dsl_vision) has no vocabulary
        self.vocab = None if vocab is None and encoder is True else positive("vocab", vocab)
        self.d_model = positive("d_model", d_model)
        try:
            self.dtype = DType.parse(dtype)
        except ValueError as err:
            raise ArgError("dtype", str(err), call_site()) from None
        if not self.dtype.is_float:
            raise ArgError("dtype", f"weights must be a float type, got {dtype}", call_site())
        self._graph = Graph(name)
        self._graph.meta = {
            "name": name, "dtype": str(self.dtype), "vocab_size": vocab, "d_model": d_model, "n_layers": 0,
            "attention": None, "n_heads": None, "n_kv_heads": None, "head_dim": None, "v_head_dim": None,
            "window": [], "attn_softcap": None, "attn_scale": None, "qkv_bias": False, "qk_norm": False,
            "rope": None, "mla": None, "norm": None, "sandwich_norm": False, "mlp": None, "d_ff": None,
            "moe": None, "tied_embeddings": False, "embedding_scale": None, "final_softcap": None,
            "ssm": None, "layer_kinds": [],
        }
        if not isinstance(encoder, bool):
            raise ArgError("encoder", f"expected true or false, got {encoder!r}", call_site())
        self.encoder = encoder
        if encoder:
            self._graph.meta["encoder"] = True
        self._pooling: dict = {}  # an encoder's pooling operands, made once
        self._origin_override: Optional[str] = None
        self._scope = ""
        self._n_layers = 0
        self._windows: dict[int, Optional[int]] = {}
        self._kinds: dict[int, list] = {}  # layer -> its mixers, in order ("attention", "mamba", "mamba2")
        self._ids: Optional[Tensor] = None
        self._blocks: Optional[Tensor] = None  # image blocks every causal attention reads (frontends.dsl_vision)
        self._deepstack: Optional[Tensor] = None  # the merged, widened embeddings DeepStack levels come from
        self._mask: Optional[Value] = None
        self._positions: Optional[Value] = None
        self._presents: list[Value] = []
        self._rope_tables: dict[tuple, tuple[Tensor, Tensor]] = {}  # decomposed RoPE's cos/sin
        self._alibi: dict[tuple, Tensor] = {}  # ALiBi slopes constants, one per slope list

    # ---- plumbing ----------------------------------------------------------------------
    @property
    def graph(self) -> Graph:
        meta = self._graph.meta
        meta["n_layers"] = self._n_layers
        meta["window"] = [self._windows.get(i) for i in range(self._n_layers)]
        meta["layer_kinds"] = ["+".join(self._kinds.get(i, [])) or "none" for i in range(self._n_layers)]
        return self._graph

    @property
    def meta(self) -> dict:
        return self._graph.meta

    @contextmanager
    def at(self, origin: str):
        """Attribute every node made inside the block to ``origin`` (e.g. ``spec.yaml:12``)."""
        saved, self._origin_override = self._origin_override, origin
        try:
            yield
        finally:
            self._origin_override = saved

    def origin(self) -> str:
        return self._origin_override or call_site()

    def error(self, arg: str, detail: str, hint: Optional[str] = None) -> ArgError:
        return ArgError(arg, detail, self.origin(), hint)

    def emit(self, op: str, inputs, attrs: Optional[dict], names) -> list[Tensor]:
        values = [t.value if isinstance(t, Tensor) else t for t in inputs]
        while values and values[-1] is None:  # omitted trailing optionals are left off
            values.pop()
        origin = self.origin()
        try:
            outs = build.emit(self._graph, op, values, attrs, names, origin=origin)
        except ShapeError as err:
            raise SpecError(err.message, location=origin, hint=err.hint) from None
        return [Tensor(self, v) for v in outs]

    def param(self, name: str, shape) -> Param:
        if name in self._graph.params:
            raise self.error("name", f"param @{name} already exists", hint="give this weight another name")
        try:
            return self._graph.add_param(name, self.dtype, shape)
        except LimitError as err:
            raise SpecError(err.message, location=self.origin(), hint=err.hint) from None

    def _features(self, x: Tensor) -> int:
        d = x.shape[-1]
        if not isinstance(d, int):
            raise self.error("x", f"feature dimension must be a number, got {d!r}")
        return d

    def _past(self, layer: int, heads: int, key_dim: int, value_dim: int, length: str = PAST) -> tuple[Value, Value]:
        """The layer's ``past_key_values.{layer}.key`` / ``.value`` inputs [B, heads, length, dim]
        (``length`` the past tokens P, or the image tokens cached for cross-attention)."""
        if self.encoder:
            raise self.error("encoder", f"layer {layer}: this attention form keeps a cache, and an encoder "
                                        "caches nothing", hint="the encoder form takes layer.attention(...)")
        prefix = f"past_key_values.{layer}"
        if any(v.name == f"{prefix}.key" for v in self._graph.inputs):
            raise self.error("layer", f"layer {layer} already has an attention cache")
        key = self._graph.add_input(f"{prefix}.key", ACTIVATION, ("B", heads, length, key_dim))
        value = self._graph.add_input(f"{prefix}.value", ACTIVATION, ("B", heads, length, value_dim))
        return key, value

    def _state(self, layer: int, kind: str, shape: tuple) -> Value:
        """The layer's ``past_key_values.{layer}.{kind}`` state input [B, *shape] (f32)."""
        if self.encoder:
            raise self.error("encoder", f"layer {layer}'s {kind}: an encoder has no recurrent state",
                             hint="the encoder form takes attention layers and feed-forward blocks")
        name = f"past_key_values.{layer}.{kind}"
        if any(v.name == name for v in self._graph.inputs):
            raise self.error("layer", f"layer {layer} already has a {kind}")
        return self._graph.add_input(name, ACTIVATION, ("B",) + tuple(shape))

    def _context(self) -> tuple[Value, Value]:
        """The attention mask and positions (None for a vision encoder: every patch visible,
        positions learned and added once)."""
        if self.meta.get("vision") is not None:  # RoPE positions only where the tower made them (patch_grid)
            return None, self._positions
        if self._mask is None:
            raise self.error("x", "call m.input_ids() first: attention needs the mask and positions")
        return self._mask, self._positions

    # ---- model-level calls -------------------------------------------------------------
    def input_ids(self, position_axes: Optional[int] = None) -> Tensor:
        """The token ids; also declares ``attention_mask`` and ``position_ids`` (an encoder:
        ``attention_mask`` [B, T], the positions 0..T-1 computed in the graph). With
        ``position_axes`` A, ``position_ids`` are i64 [A, B, T] (Qwen-VL's multimodal RoPE:
        ``Rope(mrope=...)``)."""
        if position_axes is not None:
            positive("position_axes", position_axes, self.origin())
            if self.encoder:
                raise self.error("position_axes", "an encoder computes its positions")
        if self._ids is None:
            g = self._graph
            self._ids = Tensor(self, g.add_input("input_ids", DType.i64, ("B", "T")))
            self._mask = g.add_input("attention_mask", DType.i64, ("B", "T" if self.encoder else TOTAL))
            if self.encoder:
                index = self.emit("range_like", [self._ids], {"axis": 1}, "position_index")[0]
                row = self.emit("reshape", [index], {"shape": [1, "T"]}, "position_row")[0]
                self._positions = self.emit("expand", [row], {"shape": ["B", "T"]}, "position_ids")[0].value
            else:
                axes = () if position_axes is None else (position_axes,)
                self._positions = g.add_input("position_ids", DType.i64, axes + ("B", "T"))
        return self._ids

    def _drop_unused_positions(self) -> None:
        """An encoder whose layers never read its positions (no RoPE) loses their nodes."""
        value = self._positions
        while value is not None and value.producer is not None and not value.uses:
            node = value.producer
            value = node.inputs[0] if node.op != "range_like" else None
            self._graph.remove(node)
            self._positions = None

    def embed(self, ids: Tensor, scale: Optional[float] = None, rows: Optional[int] = None) -> Tensor:
        """Token embedding ``@embed`` [V, d] (``rows`` rows where the table is longer than the
        vocabulary: Llama-3.2-Vision's 8 more), times ``scale`` (Gemma: sqrt(d)) when set."""
        scale = positive_float("scale", scale, self.origin())
        table = self.param("embed", (self.vocab if rows is None else positive("rows", rows, self.origin()),
                                     self.d_model))
        self.meta["embedding_scale"] = scale
        if self.dtype == ACTIVATION:
            return self.emit("embedding", [ids, table], {"scale": scale}, "x")[0]
        looked_up = self.emit("embedding", [ids, table], {"scale": scale}, "embed_out")[0]
        return self.emit("cast", [looked_up], {"to": str(ACTIVATION)}, "x")[0]

    def embed_positions(self, x: Tensor, positions: int, offset: int = 0) -> Tensor:
        """x plus a learned absolute position embedding ``@embed_positions`` [positions, d]
        looked up at ``position_ids`` + ``offset`` (GPT-2's wpe; OPT's table starts 2 rows
        in)."""
        positive("positions", positions, self.origin())
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < positions:
            raise self.error("offset", f"expected an integer in [0, {positions}), got {offset!r}")
        _, position_ids = self._context()
        rows = Tensor(self, position_ids)
        if offset:
            shift = self.emit("constant", [], {"value": offset, "dtype": "i64"}, "position_offset")[0]
            rows = self.emit("add", [rows, shift], None, "position_rows")[0]
        table = self.param("embed_positions", (positions, self.d_model))
        looked_up = self.emit("embedding", [rows, table], {"scale": None}, "position_embed")[0]
        if self.dtype != ACTIVATION:
            looked_up = self.emit("cast", [looked_up], {"to": str(ACTIVATION)}, "position_embed_f32")[0]
        return self.emit("add", [x, looked_up], None, "x")[0]

    def sinusoidal_positions(self, x: Tensor, offset: int = 0, padding_idx: Optional[int] = None,
                             frequencies: str = "fairseq") -> Tensor:
        """x plus sinusoidal positions at ``position_ids`` + ``offset``, computed, not stored
        (XGLM's fairseq ones: offset 2, the ``padding_idx`` row zeros; CTRL's: ``frequencies``
        "transformer"; ``irc.ops.positions``)."""
        for arg, value in (("offset", offset), ("padding_idx", padding_idx)):
            if (value is not None or arg == "offset") and (isinstance(value, bool) or not isinstance(value, int)):
                raise self.error(arg, f"expected an integer, got {value!r}")
        if self.d_model < 4:
            raise self.error("d_model", f"sinusoidal positions need d_model >= 4, got {self.d_model}")
        _, position_ids = self._context()
        attrs = {"dim": self.d_model, "offset": offset, "padding_idx": padding_idx, "frequencies": frequencies}
        table = self.emit("sinusoidal_positions", [Tensor(self, position_ids)], attrs, "position_embed")[0]
        return self.emit("add", [x, table], None, "x")[0]

    def add(self, a: Tensor, b: Tensor, name: Optional[str] = None) -> Tensor:
        return self.emit("add", [a, b], None, name or f"{self._scope}x")[0]

    def mul(self, a: Tensor, b: Tensor, name: Optional[str] = None) -> Tensor:
        return self.emit("mul", [a, b], None, name or f"{self._scope}y")[0]

    def scale(self, x: Tensor, factor: float, name: Optional[str] = None) -> Tensor:
        """x times a positive constant (a µP multiplier: Granite's residual_multiplier)."""
        if factor is None:
            raise self.error("factor", "expected a positive number, got None")
        factor = positive_float("factor", factor, self.origin())
        name = name or f"{x.name}_scaled"
        constant = self.emit("constant", [], {"value": factor}, f"{name}_factor")[0]
        return self.emit("mul", [x, constant], None, name)[0]

    def norm(self, x: Tensor, pname: str, kind: str = "rms", eps: Optional[float] = None,
             offset: float = 0.0, bias: bool = True) -> Tensor:
        """An RMS or layer norm with weight ``@pname`` [d] (layer norm: and bias ``@pname.bias``)."""
        one_of("kind", kind, ("rms", "layer"), self.origin())
        d = self._features(x)
        eps = positive_float("eps", (1e-6 if kind == "rms" else 1e-5) if eps is None else eps, self.origin())
        if self.meta["norm"] is None:
            self.meta["norm"] = {"kind": kind, "eps": eps, "offset": float(offset)}
        if pname.rsplit(".", 1)[-1] in ("post_attn_norm", "post_mlp_norm"):
            self.meta["sandwich_norm"] = True
        weight = self.param(pname, (d,))
        out = f"{pname}_out"
        if kind == "rms":
            return self.emit("rms_norm", [x, weight], {"eps": eps, "offset": float(offset)}, out)[0]
        if offset:
            raise self.error("offset", "layer norm takes no offset")
        b = self.param(f"{pname}.bias", (d,)) if bias else None
        return self.emit("layer_norm", [x, weight, b], {"eps": eps}, out)[0]

    def rms_norm(self, x: Tensor, name: str = "norm", eps: float = 1e-6, offset: float = 0.0) -> Tensor:
        return self.norm(x, name, "rms", eps, offset)

    def plain_layer_norm(self, x: Tensor, name: str, eps: float = 1e-5) -> Tensor:
        """A LayerNorm with no weight and no bias (OLMo-1's), as primitives: (x - mean) ·
        rsqrt(mean((x - mean)²) + eps) over the last axis, in x's float type."""
        eps = positive_float("eps", eps, self.origin())
        if self.meta["norm"] is None:
            self.meta["norm"] = {"kind": "layer", "eps": eps, "offset": 0.0}
        mean = self.emit("reduce_mean", [x], {"axes": [-1], "keepdims": True}, f"{name}_mean")[0]
        centred = self.emit("sub", [x, mean], None, f"{name}_centred")[0]
        square = self.emit("mul", [centred, centred], None, f"{name}_square")[0]
        variance = self.emit("reduce_mean", [square], {"axes": [-1], "keepdims": True}, f"{name}_variance")[0]
        eps_value = self.emit("constant", [], {"value": eps}, f"{name}_eps")[0]
        shifted = self.emit("add", [variance, eps_value], None, f"{name}_variance_eps")[0]
        inverse = self.emit("rsqrt", [shifted], None, f"{name}_inv_std")[0]
        return self.emit("mul", [centred, inverse], None, f"{name}_out")[0]

    def plain_rms_norm(self, x: Tensor, name: str, eps: float = 1e-6) -> Tensor:
        """An RMS norm with no weight (Llama-4's q/k norm), as primitives: x · rsqrt(mean(x²) +
        eps) over the last axis, in x's float type."""
        eps = positive_float("eps", eps, self.origin())
        square = self.emit("mul", [x, x], None, f"{name}_square")[0]
        mean = self.emit("reduce_mean", [square], {"axes": [-1], "keepdims": True}, f"{name}_mean_square")[0]
        shifted = self.emit("add", [mean, self.emit("constant", [], {"value": eps}, f"{name}_eps")[0]], None,
                            f"{name}_mean_square_eps")[0]
        return self.emit("mul", [x, self.emit("rsqrt", [shifted], None, f"{name}_inv_rms")[0]], None, f"{name}_out")[0]

    def layer_norm(self, x: Tensor, name: str = "norm", eps: float = 1e-5, bias: bool = True) -> Tensor:
        return self.norm(x, name, "layer", eps, bias=bias)

    def _check_nodes(self, estimate: int) -> None:
        try:
            check_nodes(estimate)
        except LimitError as err:
            raise self.error("n", err.message, err.hint) from None

    def logits(self, x: Tensor, tied: bool = False, softcap: Optional[float] = None,
               scale: Optional[float] = None, bias: bool = False) -> Tensor:
        """The LM head (``@lm_head`` [V, d], or ``@embed`` when tied; bias ``@lm_head.bias``
        with ``bias``, Phi-2's), times ``scale`` when set (Granite divides by
        logits_scaling), optionally soft-capped; sets the graph outputs: logits, then the
        present caches. The scale is applied to the head's input (no bias then): the head
        stays the last matmul (``last-logits`` finds it)."""
        if self.encoder:
            raise self.error("encoder", "an encoder has no logits",
                             hint="its outputs are m.last_hidden_state(...) and m.sentence_embedding(...)")
        if bias and scale is not None:
            raise self.error("bias", "a head with a bias takes no logits scale")
        softcap = positive_float("softcap", softcap, self.origin())
        scale = positive_float("scale", scale, self.origin())
        if scale is not None:
            x = self.scale(x, scale, "logits_in")
            self.meta["logits_scale"] = scale
        if tied:
            if "embed" not in self._graph.params:
                raise self.error("tied", "tied logits need m.embed() first")
            weight = self._graph.params["embed"]
        else:
            weight = self.param("lm_head", (self.vocab, self.d_model))
        self.meta["tied_embeddings"] = bool(tied)
        self.meta["final_softcap"] = softcap
        head_bias = self.param("lm_head.bias", (self.vocab,)) if bias else None
        logits = self.emit("linear", [x, weight, head_bias], None, "logits_uncapped" if softcap else "logits")[0]
        if softcap:
            logits = self.emit("softcap", [logits], {"cap": softcap}, "logits")[0]
        self._graph.outputs = [logits.value] + self._presents
        if self._positions is not None and not self._positions.uses:
            self._graph.inputs.remove(self._positions)  # nothing reads positions (no RoPE)
        return logits
