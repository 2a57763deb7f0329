"""The YAML architecture form, expanded through the DSL (``frontends.dsl``).

One top-level key, ``model``; keys follow HF configs and model cards. Defaults in
brackets; ``null`` is allowed where a default is null.

    model:
      name: llama3-8b                 # required; the graph's name
      dtype: bf16                     # weight dtype: f32 | bf16 | f16  [f32]
      vocab_size: 128256              # required
      d_model: 4096                   # required (hidden_size)
      n_layers: 32                    # required
      layers:                         # [every layer attention, then mlp/moe]
        pattern: [mamba, mamba, mamba, mamba, attention, mamba, mamba, mamba]
                                      # one kind per layer, repeated when its length divides
                                      # n_layers (Granite's layer_types, Jamba's period 8 /
                                      # offset 4); or Nemotron-H's hybrid_override_pattern
                                      # string: "M-M-M*-..." (M mamba2, * attention, - mlp,
                                      # E moe)
        feed_forward: true            # each mixer layer is followed by the mlp/moe block
                                      # [true; false when the pattern has mlp or moe layers]
        parallel: none                # attention and MLP side by side, x + attn(h) + mlp(h):
                                      # shared_norm (one norm: Phi, Cohere) | two_norms
                                      # (attn_norm and mlp_norm: GPT-NeoX) [none]
      norm: {kind: rms, eps: 1.0e-5, offset: 0.0, sandwich: false, placement: pre}
                                      # kind rms | layer [rms]; eps [1e-6 rms, 1e-5 layer];
                                      # offset: Gemma's (1 + w) is 1.0 [0.0, rms only];
                                      # sandwich: post_attn_norm/post_mlp_norm (Gemma 2/3);
                                      # bias [true, layer only]; placement post: no
                                      # norm before a branch, one after it (OLMo-2) [pre]
      attention:
        kind: gqa                     # required: mha | gqa | mqa | mla
        n_heads: 32                   # required
        n_kv_heads: 8                 # gqa: required; mha: = n_heads; mqa: 1
        head_dim: 128                 # [d_model / n_heads]
        qkv_bias: false               # Qwen2 [false]
        qk_norm: false                # RMS norms of q and k with model.norm's eps and
                                      # offset: true or head (per head: Qwen3, Gemma3), full
                                      # (over all of q's and k's features: OLMo-2) [false]
        out_bias: false               # a bias on the output projection (StarCoder2) [false]
        sinks: false                  # a learned logit per head in every softmax's
                                      # denominator, attn.sinks [n_heads] (GPT-OSS) [false]
        alibi: null                   # ALiBi in place of RoPE (rope: null): bloom (BLOOM,
                                      # Falcon) | mpt, the slopes' rule for n_heads [null]
        output_gate: false            # Qwen3-Next: wq also holds a gate per head, the output
                                      # times sigmoid(gate) goes into wo [false]
        rope: {base: 500000, convention: half, rotary_dim: null,
               scaling: {kind: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4,
                         original_max_position: 8192}}
                                      # null: no RoPE; convention half | interleaved [half];
                                      # base [10000]; scaling kinds linear | dynamic | yarn |
                                      # llama3, fields factor, original_max_position,
                                      # low_freq_factor, high_freq_factor, beta_fast,
                                      # beta_slow, mscale, mscale_all_dim, attention_factor,
                                      # truncate (yarn); longrope: short_factor and
                                      # long_factor (lists of rotary_dim / 2 numbers),
                                      # original_max_position, factor; decomposed: true writes RoPE as
                                      # primitives (cos/sin, rotate-half) for rope-fuse [false]
        window: null                  # sliding window in tokens (Mistral 4096)
        window_pattern: null          # e.g. [local, global]: layer i is windowed when
                                      # pattern[i % len] is local; null: every layer
        softcap: null                 # attention logit soft-cap (Gemma 2: 50)
        scale: null                   # score scale [head_dim ** -0.5]
        query_pre_attn_scalar: null   # Gemma: scale = value ** -0.5 (not with scale)
        nope_layers: []               # layers without RoPE (SmolLM3's no_rope_layers zeros)
        # kind mla only (DeepSeek): q_lora_rank [null: direct wq], kv_lora_rank,
        # qk_nope_head_dim, qk_rope_head_dim, v_head_dim (required); rope [base 10000,
        # interleaved]; n_kv_heads, head_dim, qkv_bias, qk_norm, output_gate, window and
        # softcap do not apply
      mlp: {kind: swiglu, d_ff: 14336}  # kind swiglu | geglu | gelu | relu2 (squared ReLU,
                                      # ungated: Nemotron-H); approximate tanh | none [geglu
                                      # tanh, gelu none]; bias [false, gelu and relu2 only].
                                      # Required when a layer has an MLP block.
      moe:                            # [null]
        experts: 160                  # required (n_routed_experts)
        top_k: 6                      # required (num_experts_per_tok)
        d_ff: 1536                    # required (moe_intermediate_size)
        shared_experts: 2             # [0]
        shared_d_ff: null             # [shared_experts * d_ff] (Qwen-MoE sets its own)
        router: softmax               # softmax | sigmoid (scoring_func) | sparsemixer (Phi-3.5-MoE:
                                      # two argmax rounds, top_k 2) [softmax]
        jitter_eps: 0.01              # sparsemixer's mask: logits below the round's max by more
                                      # than 2 * jitter_eps (relative) drop out [0.01]
        router_bias: false            # selection bias, DeepSeek-V3's e_score_correction_bias
        norm_topk_prob: true          # renormalise the top-k weights [true; sparsemixer false]
        routed_scale: 16.0            # routed_scaling_factor [1.0]
        group_limited: {groups: 8, top_groups: 3, score: max}   # [null]; score max | top2_sum
        dense_layers: [0]             # layers that use mlp instead (first_k_dense_replace) [[]]
        layers: {period: 2, offset: 1}  # or a list [1, 3, ...]: the layers that use MoE, the
                                      # others mlp (Jamba's expert_layer_period / _offset:
                                      # layer i when i % period == offset) [every layer];
                                      # give layers or dense_layers, not both
        shared_expert_gate: false     # sigmoid gate on the shared expert (Qwen-MoE) [false]
        activation: silu              # the experts' GLU: silu | gelu | ... | swiglu_oai
                                      # (GPT-OSS's clamped SwiGLU) [silu]
        swiglu_alpha: 1.702           # swiglu_oai's sigmoid slope [1.702]
        swiglu_limit: 7.0             # swiglu_oai's clamp [7.0]
        router_logit_bias: false      # the router Linear's bias on the logits (GPT-OSS) [false]
        expert_bias: false            # biases on each expert's gate, up and down (GPT-OSS) [false]
      mamba:                          # Mamba-1 mixer (Jamba, Falcon-Mamba); for mamba layers
        d_inner: null                 # intermediate_size [expand * d_model]; not with expand
        expand: 2                     # [2]
        state_size: 16                # d_state [16]
        conv_kernel: 4                # d_conv [4]
        dt_rank: null                 # time_step_rank [ceil(d_model / 16)]
        conv_bias: true               # use_conv_bias [true]
        proj_bias: false              # use_bias: in_proj and out_proj biases [false]
        bcdt_norm: null               # RMS norms on dt, B and C: weighted (Jamba) | plain
                                      # (weightless: Falcon-Mamba) [null]
        norm_eps: null                # their eps (with bcdt_norm) [model.norm.eps]
      mamba2:                         # Mamba-2 mixer (SSD); for mamba2 layers
        n_heads: 128                  # num_heads [expand * d_model / head_dim]
        head_dim: 64                  # [64]
        expand: 2                     # n_heads * head_dim must be expand * d_model (checked
                                      # when both are given; leave expand out when d_inner
                                      # is set apart from it: Falcon-H1's mamba_d_ssm) [2]
        state_size: 128               # d_state [128]
        n_groups: 1                   # groups of B and C; divides n_heads. The gated RMS norm
                                      # runs over d_inner / n_groups features at a time [1]
        conv_kernel: 4                # d_conv [4]
        conv_bias: true               # use_conv_bias [true]
        proj_bias: false              # use_bias [false]
        time_step_limit: [0.0, .inf]  # clamp of the step size dt (config.json's
                                      # time_step_limit; time_step_min only initialises) [[0.0, .inf]]
        norm_eps: null                # the gated norm's eps [model.norm.eps]
        norm_before_gate: false       # [false]
      short_conv:                     # LFM2's gated short convolution; for conv layers
        conv_kernel: 3                # conv_L_cache: taps, the conv state keeps 2 [3]
        bias: false                   # conv_bias: in_proj, conv and out_proj biases [false]
      gated_delta:                    # Qwen3-Next / Qwen3.5 gated DeltaNet; for gated_delta layers
        linear_num_key_heads: 16      # [16]
        linear_num_value_heads: 32    # a multiple of the key heads [32]
        linear_key_head_dim: 128      # [128]
        linear_value_head_dim: 128    # [128]
        linear_conv_kernel_dim: 4     # taps of the causal conv over q|k|v [4]
        projections: split            # split: in_proj_qkv/z/b/a (Qwen3.5) | fused: in_proj_qkvz
                                      # and in_proj_ba grouped by key head (Qwen3-Next) [split]
        conv_bias: false              # [false]
        norm_eps: null                # the gated RMS norm's eps [model.norm.eps]
      kimi_delta:                     # Kimi Delta Attention (Kimi-Linear); for kimi_delta layers
        heads: 32                     # linear_attn_config.num_heads [32]
        head_dim: 128                 # [128]
        conv_kernel: 4                # short_conv_kernel_size [4]
        norm_eps: null                # the output norm's eps [model.norm.eps]
      lightning:                      # MiniMax's lightning attention; for lightning layers
        heads: 64                     # required; the decay slopes are MiniMax's formula per layer
        head_dim: 96                  # required
        norm_eps: 1.0e-6              # the full-width norm's eps [1e-6]
      normed_residual:                # MiniMax: each branch joins as alpha·h + beta·y, h its
        attention: [1.0, 1.0]         # normed input, per role: attention layers, the other
        mixer: [1.0, 1.0]             # mixers, the feed-forward block [[1, 1] each]; not with
        feed_forward: [1.0, 1.0]      # residual_scale [null]
      tied_embeddings: false          # LM head reuses @embed [false]
      final_softcap: null             # logit soft-cap (Gemma 2: 30)
      embedding_scale: null           # a number, or sqrt_d_model (Gemma)
      residual_scale: null            # each branch times this as it joins the residual
                                      # stream (Granite's residual_multiplier)
      logits_scale: null              # logits times this (Granite: 1 / logits_scaling)
      learned_positions: null         # a learned position table of this many rows, added
                                      # to the embedding (GPT-2's n_positions) [null]
      head_bias: false                # the LM head has a bias (Phi-2) [false]
      embedding_norm: false           # model.norm's kind of norm on the embeddings,
                                      # @embed_norm (BLOOM's word_embeddings_layernorm) [false]
      gemma3n:                        # Gemma-3n's layer form (frontends.yaml_gemma) [null]
        altup: {num_inputs: 4, active_idx: 0, correct_scale: true}
                                      # AltUp's streams (required), the active one [0], the
                                      # learned scale of the corrected active stream [true]
                                      # (altup_coef_clip is training-only: no key)
        laurel_rank: 64               # required: LAuReL's low rank
        per_layer_input: {hidden_size: 256, vocab_size: 262144}
                                      # the per-layer embeddings' width (required) and table
                                      # rows [vocab_size]; ids past them read row 0
        kv_shared_layers: 15          # the last layers reuse the K/V of the last earlier
                                      # layer of their kind (local / global) [0]
        activation_sparsity: [0.95, 0.95, 0.0]  # per layer p in [0, 1): the GeGLU keeps gate
                                      # values above mean + std * icdf(p) [0.0 each: dense]
        d_ff: [16384, 16384, 16384]   # per-layer MLP widths [mlp.d_ff each]
        local_rope_base: 10000        # the RoPE base of local layers, unscaled; global layers
                                      # use attention.rope [10000]
                                      # Requires norm sandwich: true (rms, offset 0),
                                      # attention qk_norm: true and scale: 1.0, a rope, mlp kind
                                      # geglu; refuses layers, moe, the mixers, multipliers,
                                      # attention biases / sinks / softcap / nope_layers
      gemma4:                         # Gemma-4's layer form (frontends.yaml_gemma), with the
                                      # same requirements as gemma3n (not with it) [null]
        global_attention: {head_dim: 512, n_kv_heads: 1}
                                      # the global layers' shape [attention's head_dim and
                                      # n_kv_heads]; their RoPE is attention.rope (Gemma-4's
                                      # scaling {kind: proportional, partial_rotary_factor}),
                                      # no rotary_dim; the last layer must be global
        k_eq_v: false                 # global layers' values are their key projection [false]
        per_layer_input: {hidden_size: 256, vocab_size: 262144}  # as gemma3n's [null: none]
        kv_shared_layers: 0           # as gemma3n's [0]
        double_wide_mlp: false        # the KV-sharing layers' MLPs are 2 * mlp.d_ff wide [false]
        moe: {experts: 128, top_k: 8, d_ff: 704}   # a MoE beside every layer's MLP [null]
        local_rope_base: 10000        # as gemma3n's [10000]

Layer kinds: ``attention``, ``mamba``, ``mamba2``, ``conv`` (LFM2's short convolution,
``short_conv``), ``gated_delta`` (Qwen3-Next's gated DeltaNet, ``gated_delta``), ``kimi_delta``
(Kimi Delta Attention, ``kimi_delta``), ``lightning`` (MiniMax's, ``lightning``) (one mixer
on the layer's norm, then a residual add), ``mamba+attention`` /
``mamba2+attention`` (both mixers on one norm, their outputs summed into one residual add,
the state-space mixer first: Falcon-H1's parallel hybrid heads), ``mlp``, ``moe``
(a feed-forward block alone: Nemotron-H's ``-`` and ``E``; ``moe`` is irc's gated-expert
moe, not Nemotron-H's ungated squared-ReLU experts). With ``feed_forward``, every
mixer layer is followed by ``mlp_norm`` -> mlp or moe (as ``moe.layers`` / ``dense_layers``
choose) -> residual; without it a mixer layer is the mixer alone (Mamba, Nemotron-H). The
norms are named as ``frontends.hf.build`` names them, so the three forms give the same
graph: ``attn_norm`` before attention (and before a parallel pair), ``ssm_norm`` before a
state-space mixer, ``mlp_norm`` before a feed-forward block, ``norm`` at the end. A mixer
section (``attention``, ``mamba``, ``mamba2``, ``short_conv`` for conv layers, ``gated_delta``) is required
when a layer uses it; a state-space section that no layer uses is refused (a forgotten
``layers`` pattern). The layer stack's readers (pattern, mamba/mamba2/short_conv/gated_delta sections,
MoE layers) are ``frontends.yaml_ssm``.

Errors are ``SpecError`` at the offending key's file:line:col, the message starting with
its key path: ``model.attention.n_kv_heads: 32 heads are not divisible by 5 kv heads``.
Each node's origin is the ``file:line`` of the key that produced it (norms: ``norm``,
attention: ``attention``, state-space mixers: ``mamba`` / ``mamba2`` / ``short_conv`` / ``gated_delta``,
residual adds: ``n_layers``, embedding: ``vocab_size``, ...; a Gemma-3n or Gemma-4 graph:
``gemma3n`` / ``gemma4``).
"""
from __future__ import annotations

import math
from typing import Optional

from irc import yamlloc
from frontends import yaml_gemma, yaml_ssm, yaml_vision
from frontends.dsl import Model
from frontends.dsl_vision import BIDIRECTIONAL
from frontends.dsl_hybrid import scaled
from frontends.dsl_lightning import lightning_slopes
from frontends.yaml_attention import ATTENTION_KEYS, AttentionReader, blame
from frontends.yaml_ffn import MLP_KEYS, MOE_KEYS, FeedForwardReader
from irc.yamlloc import (Bad, Fields, boolean, choice, layer_count, non_negative_int, number, optional, positive_int,
                               positive_number, string)
from irc.errors import SpecError
from irc.graph import Graph

MODEL_KEYS = ("name", "dtype", "vocab_size", "d_model", "n_layers", "layers", "norm", "attention", "mamba", "mamba2",
              "short_conv", "gated_delta", "mlp", "moe", "tied_embeddings", "final_softcap", "embedding_scale",
              "residual_scale", "logits_scale", "kimi_delta", "lightning", "normed_residual", "learned_positions",
              "head_bias", "gemma3n", "gemma4", "vision", "image_input", "embedding_norm")
NORMED_RESIDUAL_KEYS = ("attention", "mixer", "feed_forward")
NORM_KEYS = ("kind", "eps", "offset", "sandwich", "bias", "placement")
PARALLEL = ("none", "shared_norm", "two_norms")

def loads(text: str, filename: str = "<string>") -> Graph:
    return build(yamlloc.loads(text, filename), filename)


def load(path) -> Graph:
    return build(yamlloc.load_file(path), str(path))


def build(data, filename: str) -> Graph:
    """The graph of a parsed architecture spec (``{"model": {...}}``)."""
    root = Fields(data, "", ("model",), parent_loc=yamlloc.Loc(filename, 1, 1))
    model = root.sub("model", MODEL_KEYS, required=True)
    if model.data.get("vision") is not None:  # an image encoder: frontends.yaml_vision
        return yaml_vision.build(model)
    return _Expander(model).run()


def _factor_pair(value) -> tuple:
    if not (isinstance(value, list) and len(value) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value)):
        raise Bad(f"expected [alpha, beta], two positive numbers, got {value!r}")
    return float(value[0]), float(value[1])


def _embedding_scale(value):
    if value == "sqrt_d_model":
        return value
    try:
        return positive_number(value)
    except Bad:
        raise Bad(f"expected a positive number or sqrt_d_model, got {value!r}") from None


class _Expander(AttentionReader, FeedForwardReader):
    """Reads (validating as it goes) and drives the DSL in the order a DSL author would."""

    def __init__(self, model: Fields):
        self.f = model
        self.name = model.get("name", string)
        self.dtype = model.get("dtype", choice("f32", "bf16", "f16"), "f32")
        self.vocab = model.get("vocab_size", positive_int)
        self.d_model = model.get("d_model", positive_int)
        self.n_layers = model.get("n_layers", layer_count)
        self.tied = model.get("tied_embeddings", boolean, False)
        self.final_softcap = model.get("final_softcap", optional(positive_number), None)
        scale = model.get("embedding_scale", optional(_embedding_scale), None)
        self.embedding_scale = math.sqrt(self.d_model) if scale == "sqrt_d_model" else scale
        self.residual_scale = model.get("residual_scale", optional(positive_number), None)
        self.logits_scale = model.get("logits_scale", optional(positive_number), None)
        self.learned_positions = model.get("learned_positions", optional(positive_int), None)
        self.head_bias = model.get("head_bias", boolean, False)
        self.embedding_norm = model.get("embedding_norm", boolean, False)
        self._read_norm(model.sub("norm", NORM_KEYS))
        self.layers_f = model.sub("layers", yaml_ssm.LAYERS_KEYS)
        self.kinds, self.feed_forward = yaml_ssm.read_pattern(self.layers_f, self.n_layers)
        self.parallel = self.layers_f.get("parallel", choice(*PARALLEL), "none") if self.layers_f else "none"
        if self.parallel != "none" and self.residual_scale is not None:
            raise self.f.error("residual_scale", "a parallel block takes no residual_scale")
        self.attn_f = self._section("attention", ATTENTION_KEYS)
        if self.attn_f is not None:
            self._read_attention(self.attn_f)
        self.mamba_f = self._section("mamba", yaml_ssm.MAMBA_KEYS)
        self.mamba2_f = self._section("mamba2", yaml_ssm.MAMBA2_KEYS)
        self.conv_f = self._section("short_conv", yaml_ssm.SHORT_CONV_KEYS, kind="conv")
        self.delta_f = self._section("gated_delta", yaml_ssm.GATED_DELTA_KEYS)
        self.kimi_f = self._section("kimi_delta", yaml_ssm.KIMI_DELTA_KEYS)
        self.lightning_f = self._section("lightning", yaml_ssm.LIGHTNING_KEYS)
        self.ssm = {"mamba": yaml_ssm.read_mamba(self.mamba_f, self.d_model, self.norm_eps),
                    "mamba2": yaml_ssm.read_mamba2(self.mamba2_f, self.d_model, self.norm_eps),
                    "conv": yaml_ssm.read_short_conv(self.conv_f),
                    "gated_delta": yaml_ssm.read_gated_delta(self.delta_f, self.norm_eps),
                    "kimi_delta": yaml_ssm.read_kimi_delta(self.kimi_f, self.norm_eps),
                    "lightning": yaml_ssm.read_lightning(self.lightning_f)}
        self._read_normed_residual(model.sub("normed_residual", NORMED_RESIDUAL_KEYS))
        self._read_moe(model.sub("moe", MOE_KEYS))
        self._read_mlp(model.sub("mlp", MLP_KEYS))
        gemma3n = model.sub("gemma3n", yaml_gemma.GEMMA3N_KEYS)
        gemma4 = model.sub("gemma4", yaml_gemma.GEMMA4_KEYS)
        self.gemma = yaml_gemma.Gemma3nReader(self, gemma3n) if gemma3n is not None else \
            yaml_gemma.Gemma4Reader(self, gemma4) if gemma4 is not None else None

    # ---- reading -----------------------------------------------------------------------
    def _read_norm(self, norm: Optional[Fields]) -> None:
        self.norm_f = norm or Fields({}, "model.norm", NORM_KEYS, parent_loc=self.f.key_loc)
        n = self.norm_f
        self.norm_kind = n.get("kind", choice("rms", "layer"), "rms")
        self.norm_eps = n.get("eps", positive_number, 1e-6 if self.norm_kind == "rms" else 1e-5)
        self.norm_offset = n.get("offset", number, 0.0)
        self.sandwich = n.get("sandwich", boolean, False)
        self.norm_bias = n.get("bias", boolean, True)
        self.post_norm = n.get("placement", choice("pre", "post"), "pre") == "post"
        if self.post_norm and self.sandwich:
            raise n.error("placement", "placement post already norms each branch's output: leave sandwich out")
        if self.norm_kind == "layer" and n.has("offset"):
            raise n.error("offset", "offset applies to rms norms only")
        if self.norm_kind == "rms" and n.has("bias"):
            raise n.error("bias", "bias applies to layer norms only")

    def _read_normed_residual(self, r: Optional[Fields]) -> None:
        """MiniMax's residual: each branch joins as alpha·h + beta·y, h its normed input."""
        self.normed_residual = None
        if r is None:
            return
        if self.residual_scale is not None:
            raise self.f.error("residual_scale", "give residual_scale or normed_residual, not both")
        self.normed_residual = {key: tuple(r.get(key, _factor_pair, (1.0, 1.0))) for key in NORMED_RESIDUAL_KEYS}

    def _first(self, kind: str) -> Optional[int]:
        """The first layer whose kind is or contains ``kind``."""
        return next((i for i, k in enumerate(self.kinds) if kind in k.split("+")), None)

    def _section(self, key: str, keys, kind: Optional[str] = None) -> Optional[Fields]:
        """The mixer section ``key`` of the layers of ``kind`` (default: ``key``): required
        when a layer uses it. A state-space section no layer uses is refused (the pattern
        was likely forgotten); attention is read."""
        kind = kind or key
        layer = self._first(kind)
        if layer is None and key != "attention":
            if self.f.data.get(key) is not None:
                raise self.f.error(key, f"no layer is {kind}", hint=f"add {kind} layers to model.layers.pattern")
            return None
        if layer is not None and not self.f.has(key):
            raise self._missing(key, layer, f"is {self.kinds[layer]}")
        return self.f.sub(key, keys, required=layer is not None)

    def _missing(self, key: str, layer: int, what: str) -> SpecError:
        """``model.{key}: missing required key``, the hint naming the layer that needs it
        (when a pattern set the layers)."""
        return SpecError(f"{self.f.key_path(key)}: missing required key", location=str(self.f.key_loc),
                         hint=None if self.layers_f is None else f"layer {layer} {what}")

    # ---- expanding ---------------------------------------------------------------------
    def run(self) -> Graph:
        if self.gemma is not None:
            return self.gemma.graph()
        f = self.f
        with blame(f, {"vocab": (f, "vocab_size"), "d_model": (f, "d_model"), "name": (f, "name")}):
            m = Model(self.name, vocab=self.vocab, d_model=self.d_model, dtype=self.dtype)
        with m.at(f.origin("vocab_size")), blame(f, {"scale": (f, "embedding_scale")}):
            x = m.embed(m.input_ids(), scale=self.embedding_scale)
            if self.learned_positions:
                x = m.embed_positions(x, self.learned_positions)
        if self.embedding_norm:
            x = self._norm(m, x, "embed_norm")
        image = f.sub("image_input", yaml_vision.IMAGE_INPUT_KEYS)
        if image is not None:  # a VLM's decoder: the image features at the placeholders (frontends.yaml_vision)
            with m.at(image.origin()):
                x = m.merge_image_features(x, image.get("token", non_negative_int),
                                           image.get("bidirectional", choice(*BIDIRECTIONAL), "none"))
        with blame(f, {"n": (f, "n_layers")}):  # a size limit (irc.limits)
            x = self._layers(m, x)
        x = self._norm(m, x, "norm")
        with m.at(f.origin("final_softcap" if self.final_softcap else "vocab_size")):
            m.logits(x, tied=self.tied, softcap=self.final_softcap, scale=self.logits_scale, bias=self.head_bias)
        if image is not None:
            m.vision_model(yaml_vision.build_vision_model(image.sub("vision_model", yaml_vision.MODEL_KEYS + (
                "features",), required=True), self.d_model))
        return m.graph

    def _layers(self, m: Model, x):
        f = self.f
        for layer in m.layers(self.n_layers):
            kind, ffn = self.kinds[layer.index], self.ffn[layer.index]
            if self.parallel != "none" and kind == "attention" and ffn is not None:
                x = self._parallel(m, layer, x, ffn)
                continue
            if kind in yaml_ssm.MIXERS:
                mixers = kind.split("+")
                norm = layer.prefix + ("attn_norm" if "attention" in mixers else "ssm_norm")
                h = x if self.post_norm else self._norm(m, x, norm)
                out = self._mixer(m, layer, mixers[0], h)
                if len(mixers) == 2:  # the state-space mixer first, as Falcon-H1's code runs them
                    a = self._mixer(m, layer, mixers[1], h)
                    with m.at(self.layers_f.origin("pattern")):
                        out = m.add(out, a, f"{layer.prefix}mixers_out")
                with m.at(f.origin("n_layers")):
                    x = self._join(m, x, h, out, "attention" if "attention" in mixers else "mixer",
                                   f"{layer.prefix}mixer")
            if ffn is None:
                continue
            h = x if self.post_norm else self._norm(m, x, layer.prefix + "mlp_norm")
            out = self._feed_forward(m, layer, h, ffn)
            if self.sandwich or self.post_norm:
                out = self._norm(m, out, layer.prefix + "post_mlp_norm")
            with m.at(f.origin("n_layers")):
                x = self._join(m, x, h, out, "feed_forward", f"{layer.prefix}{ffn}")
        return x

    def _parallel(self, m: Model, layer, x, ffn: str):
        """x + attn(h) + ffn(h'), h the attention's norm, h' the same (shared_norm: Phi,
        Cohere) or its own mlp_norm (two_norms: GPT-NeoX)."""
        h = self._norm(m, x, layer.prefix + "attn_norm")
        out = self._mixer(m, layer, "attention", h)
        h2 = h if self.parallel == "shared_norm" else self._norm(m, x, layer.prefix + "mlp_norm")
        branch = self._feed_forward(m, layer, h2, ffn)
        with m.at(self.f.origin("n_layers")):
            return x + m.add(out, branch, f"{layer.prefix}branches")

    def _join(self, m: Model, x, h, branch, role: str, name: str):
        """The residual stream after a branch: x + branch (times ``residual_scale``), or
        alpha·h + beta·branch with ``normed_residual``'s factors for the role."""
        if self.normed_residual is not None:
            alpha, beta = self.normed_residual[role]
            return m.add(scaled(m, h, alpha, f"{name}_residual_scaled"), scaled(m, branch, beta, f"{name}_out_scaled"))
        return x + (branch if self.residual_scale is None else branch * self.residual_scale)

    def _mixer(self, m: Model, layer, mixer: str, h):
        if mixer == "attention":
            with m.at(self.attn_f.origin()), blame(self.attn_f, self._attention_table()):
                a = self._attention(layer, h)
            return self._norm(m, a, layer.prefix + "post_attn_norm") if self.sandwich or self.post_norm else a
        if mixer == "conv":
            with m.at(self.conv_f.origin()), blame(self.conv_f):
                return layer.short_conv(h, **self.ssm["conv"])
        if mixer == "kimi_delta":
            with m.at(self.kimi_f.origin()), blame(self.kimi_f):
                return layer.kimi_delta(h, **self.ssm["kimi_delta"])
        if mixer == "lightning":
            config = self.ssm["lightning"]
            with m.at(self.lightning_f.origin()), blame(self.lightning_f):
                slopes = lightning_slopes(config["heads"], layer.index, self.n_layers)
                return layer.lightning_attention(h, slopes=slopes, **config)
        if mixer == "gated_delta":
            s = self.delta_f
            with m.at(s.origin()), blame(s, {arg: (s, key) for arg, key in yaml_ssm.GATED_DELTA_ARGS.items()}):
                return layer.gated_delta(h, **self.ssm["gated_delta"])
        s = self.mamba_f if mixer == "mamba" else self.mamba2_f
        with m.at(s.origin()), blame(s, {arg: (s, key) for arg, key in yaml_ssm.MAMBA2_ARGS.items()}):
            return (layer.mamba if mixer == "mamba" else layer.mamba2)(h, **self.ssm[mixer])

    def _norm(self, m: Model, x, pname: str):
        with m.at(self.norm_f.origin()), blame(self.norm_f):
            return m.norm(x, pname, self.norm_kind, self.norm_eps, self.norm_offset, self.norm_bias)

