"""The model DSL: a builder whose calls read like the model code.

    m = Model("tiny-llama", vocab=256, d_model=64)
    x = m.embed(m.input_ids())
    for layer in m.layers(2):
        x = x + layer.attention(layer.rms_norm(x, name="attn_norm"), heads=4, kv_heads=2,
                                rope=Rope(base=1e4))
        x = x + layer.swiglu(layer.rms_norm(x, name="mlp_norm"), d_ff=160)
    m.logits(m.rms_norm(x, name="norm"))
    graph = m.graph

The YAML architecture form (``frontends.yaml_spec``) expands through this builder, so both
give the same graph for the same model.

Conventions the backends and analyses rely on:

- Graph inputs: ``input_ids`` i64[B,T], ``attention_mask`` i64[B,P+T], ``position_ids``
  i64[B,T] (all three made by ``input_ids()``), then per layer ``past_key_values.{i}.key``
  [B,K,P,D] and ``.value`` [B,K,P,Dv] (made by the layer's attention), and a state-space
  layer's ``past_key_values.{i}.conv_state`` / ``.recurrent_state`` (fixed size but the
  batch: ``frontends.dsl_ssm``). Outputs: ``logits`` f32[B,T,V], then ``present.{i}.*`` in
  the order the layers made them. Every decoder graph is in KV-cache form; bind P to 0 for
  prefill (and feed zero states). An encoder (``Model(encoder=True)``, an embedding model:
  ``frontends.dsl_encoder``) takes ``input_ids`` and ``attention_mask`` [B,T] only, computes
  its positions, and returns ``last_hidden_state`` (and ``sentence_embedding``). MLA caches
  per head: [B,H,P,nope+rope] and [B,H,P,v]. A model whose layers never read
  ``position_ids`` (no RoPE: Mamba) does not take it.
- Weights are params with dotted checkpoint-like names (``layers.3.attn.wq``), data absent,
  dtype ``Model(dtype=...)`` (default ``"f32"``). Activations and the KV cache are always
  f32: when the embedding table is not f32, a ``cast`` to f32 follows the lookup.
- Value names are layer-prefixed hints (``layers.0.q``, ``layers.0.attn_out``,
  ``layers.0.x`` for the residual stream); the graph suffixes ``_N`` on collision.
- A node's ``origin`` is the call site outside this module (``model.py:12``), or the
  location set with ``Model.at(...)`` (the YAML form passes its key's ``file:line``).
- Float arguments are stored as floats (``1e4`` and ``10000`` give the same graph).
- Mistakes raise ``ArgError`` (a ``SpecError``) at the call site naming the argument.
"""
from __future__ import annotations

from typing import Iterator, Optional

from irc.limits import check_layers
from frontends import dsl_core
from frontends.dsl_args import ArgError, positive  # noqa: F401 (ArgError: the DSL's names, importable here)
from frontends.dsl_attention import AttentionLayer
from frontends.dsl_core import ACTIVATION, PAST, TOTAL, Tensor  # noqa: F401 (the DSL's names, importable here)
from frontends.dsl_delta import DeltaLayer
from frontends.dsl_encoder import EncoderOutputs
from frontends.dsl_lightning import LightningLayer
from frontends.dsl_mlp import MlpLayer
from frontends.dsl_mlstm import MlstmLayer
from frontends.dsl_moe import MoeLayer
from frontends.dsl_rope import Rope  # noqa: F401 (the DSL's names, importable here)
from frontends.dsl_rglru import RglruLayer
from frontends.dsl_rwkv import RwkvLayer
from frontends.dsl_ssm import SsmLayer
from frontends.dsl_vision import VisionInputs, VisionLayer


class Model(dsl_core.Model, EncoderOutputs, VisionInputs):
    """Builds one decoder graph, or with ``encoder`` an encoder graph (no caches, no logits:
    ``frontends.dsl_encoder``); see the module docstring for the conventions. Its core
    methods are ``frontends.dsl_core.Model``'s."""

    def layers(self, n: int) -> Iterator["Layer"]:
        """Yield ``n`` layers, numbered on from the layers made so far. Once the first is
        built, the graph's size is estimated and held to ``irc.limits`` (argument ``n``)."""
        positive("n", n, self.origin(), limit=check_layers)
        before = len(self._graph.nodes)
        for k in range(n):
            index = self._n_layers
            self._n_layers += 1
            self._scope = f"layers.{index}."
            yield Layer(self, index)
            if k == 0:
                self._check_nodes(before + (len(self._graph.nodes) - before) * n)
        self._scope = ""


class Layer(AttentionLayer, MlpLayer, MoeLayer, SsmLayer, DeltaLayer, LightningLayer, VisionLayer, RwkvLayer,
            RglruLayer, MlstmLayer):
    """One decoder layer: its weights are ``layers.{i}.*``, its values ``layers.{i}.*``
    (attention ``frontends.dsl_attention``, the MLPs ``frontends.dsl_mlp``, the mixture of
    experts ``frontends.dsl_moe``, the
    state-space mixers ``frontends.dsl_ssm``, gated DeltaNet ``frontends.dsl_delta``, lightning
    attention ``frontends.dsl_lightning``)."""

    DEFAULT_NORMS = ("attn_norm", "mlp_norm")

    def __init__(self, model: Model, index: int):
        self.model, self.index = model, index
        self.prefix = f"layers.{index}."
        self._unnamed_norms = 0

    def __repr__(self) -> str:
        return f"<Layer {self.index}>"

    def _norm_name(self, name: Optional[str]) -> str:
        if name is not None:
            return name
        if self._unnamed_norms >= len(self.DEFAULT_NORMS):
            raise self.model.error("name", "name this norm (the first two default to attn_norm, mlp_norm)")
        self._unnamed_norms += 1
        return self.DEFAULT_NORMS[self._unnamed_norms - 1]

    def rms_norm(self, x: Tensor, name: Optional[str] = None, eps: float = 1e-6, offset: float = 0.0) -> Tensor:
        """``@layers.{i}.{name}``; unnamed norms are attn_norm, then mlp_norm."""
        return self.model.norm(x, self.prefix + self._norm_name(name), "rms", eps, offset)

    def layer_norm(self, x: Tensor, name: Optional[str] = None, eps: float = 1e-5, bias: bool = True) -> Tensor:
        return self.model.norm(x, self.prefix + self._norm_name(name), "layer", eps, bias=bias)
