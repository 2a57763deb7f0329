"""xLSTM (``frontends.hf.families`` dispatches here), built by its own loop through the DSL
(``expand``, set as ``Arch.expand``; the mLSTM layer is ``frontends.dsl_mlstm``'s):

=====  ==================================================================================
xlstm  xLSTM-7B (transformers' ``xLSTMForCausalLM``): embeddings; per block
       x + mlstm(rms_norm(x)) (q, k, v and output-gate projections, soft-capped input and
       forget gate pre-activations, the mLSTM recurrence ``irc.ops.mlstm``, a per-head
       LayerNorm times its weight, sigmoid(o) gate, ``out_proj``), x + ffn(rms_norm(x))
       (SwiGLU: silu(proj_up_gate) · proj_up -> proj_down); ``out_norm`` -> ``lm_head``
       -> tanh soft-cap ``output_logit_soft_cap``
=====  ==================================================================================

Sizes follow ``xLSTMLayer`` (the weights' shapes): qk_dim = int(hidden_size ·
qk_dim_factor), v_dim = int(hidden_size · v_dim_factor), split into ``num_heads`` heads; the
FFN is hidden_size · ffn_proj_factor rounded up to ``ffn_round_up_to_multiple_of``. The
blocks are ``num_blocks`` (None: num_hidden_layers; no more than it), the stream
``hidden_size`` (None: embedding_dim). transformers' ``xLSTMCache`` sizes its state by
qk_dim and v_dim rounded up to 64: where those differ from the layer's, transformers fails
once it carries a cache; irc follows the weights. ``out_norm`` is applied whatever
``add_out_norm`` says (transformers builds and applies it unconditionally); the head is
``lm_head.weight`` whatever ``tie_word_embeddings`` says (``xLSTMForCausalLM`` names no tied
weights, so transformers never ties it). ``use_bias`` gives every projection, both block
norms and the per-head norm a bias (not ``out_norm``), as transformers does. The kernel
choices (``chunkwise_kernel``, ``sequence_kernel``, ``step_kernel``, ``chunk_size``,
``autocast_kernel_dtype``, ``max_inference_chunksize``) pick implementations of one function
and are read as such; ``mode`` must be "inference" (transformers' training modes take only
whole chunks) and ``inference_state_dtype`` float32 (irc keeps the state in float32);
``weight_mode`` "fused" is refused (transformers 5.25 cannot build it: its ``_init_weights``
fails on the fused gate bias).

The state per block: ``past_key_values.{i}.recurrent_state`` [B, H, dk, dv] (the matrix
memory C), ``.normalizer_state`` [B, H, dk] and ``.max_state`` [B, H, 1] (transformers'
``rnn_state[i]``), float32; a zero state is the empty one, as transformers' cache starts.
transformers' xLSTM takes no ``attention_mask``, and irc ignores it too: a left-padded row's
pad tokens pass through the recurrence as they do in transformers.

Checkpoint names (``LAYOUTS``): ``backbone.embeddings.weight``,
``backbone.blocks.{i}.norm_mlstm`` / ``norm_ffn``, ``backbone.blocks.{i}.mlstm_layer.{q,k,v,
ogate_preact,igate_preact,fgate_preact,multihead_norm,out_proj}``,
``backbone.blocks.{i}.ffn.{proj_up_gate,proj_up,proj_down}`` (each with its ``.bias`` under
``use_bias``, the two block norms too), ``backbone.out_norm.weight``, ``lm_head.weight``.
"""
from __future__ import annotations

from frontends.hf.config import Arch, Config, LayerSpec
from irc.yamlloc import boolean, layer_count, positive_int, positive_number

DEFAULTS = {  # transformers 5.25's xLSTMConfig
    "xlstm": {"vocab_size": 50304, "hidden_size": 4096, "embedding_dim": None, "num_hidden_layers": 32,
              "num_blocks": None, "num_heads": 8, "use_bias": False, "norm_reduction_force_float32": True,
              "tie_word_embeddings": False, "add_out_norm": True, "norm_eps": 1e-6, "qk_dim_factor": 0.5,
              "v_dim_factor": 1.0, "mode": "inference", "chunk_size": 64, "eps": 1e-6,
              "inference_state_dtype": "float32", "ffn_proj_factor": 2.667, "ffn_round_up_to_multiple_of": 64,
              "gate_soft_cap": 15.0, "output_logit_soft_cap": 30.0, "weight_mode": "single"},
}

_LAYER = "mlstm_layer."
_PROJECTIONS = (("wq", "q"), ("wk", "k"), ("wv", "v"), ("wo_gate", "ogate_preact"), ("out", "out_proj"),
                ("norm", "multihead_norm"), ("igate", "igate_preact"), ("fgate", "fgate_preact"))
LAYOUTS = {
    "xlstm": {
        "attn_norm": "norm_mlstm.weight", "mlp_norm": "norm_ffn.weight",
        **{f"mlstm.{irc}": f"{_LAYER}{hf}.weight" for irc, hf in _PROJECTIONS},
        **{f"mlstm.{irc}_bias": f"{_LAYER}{hf}.bias" for irc, hf in _PROJECTIONS},
        "attn_norm.bias": "norm_mlstm.bias", "mlp_norm.bias": "norm_ffn.bias",
        **{f"mlp.{p}_{x}": f"ffn.proj_{hf}.{w}" for x, hf in (("gate", "up_gate"), ("up", "up"), ("down", "down"))
           for p, w in (("w", "weight"), ("b", "bias"))},
        "_prefix": "backbone.blocks.",
        "_top": {"embed": "backbone.embeddings.weight", "norm": "backbone.out_norm.weight",
                 "lm_head": "lm_head.weight"},
    },
}


def _optional_cap(cfg: Config, key: str):
    """A soft-cap: a positive number, or null for none (transformers' ``soft_cap`` passes
    None through)."""
    return cfg.get(key, positive_number, None)


def _sizes(cfg: Config) -> tuple[int, int]:
    """(hidden size, blocks): ``hidden_size`` (None: embedding_dim), which embedding_dim must
    equal; ``num_blocks`` (None: num_hidden_layers), at most num_hidden_layers."""
    d = cfg.get("hidden_size", positive_int, None) or cfg.get("embedding_dim", positive_int)
    embedding = cfg.get("embedding_dim", positive_int, None)
    if embedding is not None and embedding != d:
        raise cfg.error("embedding_dim", f"{embedding} differs from hidden_size {d}: transformers' embedding is "
                                         "embedding_dim wide and its blocks hidden_size wide")
    layers = cfg.get("num_hidden_layers", layer_count, None)
    n = cfg.get("num_blocks", layer_count, None) or layers
    if n is None:
        raise cfg.error("num_blocks", "neither num_blocks nor num_hidden_layers is given")
    if layers is not None and n > layers:
        raise cfg.error("num_blocks", f"{n} blocks but num_hidden_layers {layers}: transformers' cache holds "
                                      "num_hidden_layers states, and the blocks past them have none")
    return d, n


def _width(cfg: Config, d: int, key: str, heads: int) -> int:
    """int(d · factor), as ``xLSTMLayer`` sizes its projections; a multiple of the heads."""
    width = int(d * cfg.get(key, positive_number))
    if width < heads or width % heads:
        raise cfg.error(key, f"hidden_size {d} times {cfg.raw(key)!r} is {width}, not a multiple of num_heads {heads}")
    return width


def _xlstm(cfg: Config, name: str, model_type: str) -> Arch:
    """xLSTM: the sizes of ``xLSTMConfig`` / ``xLSTMLayer`` (see the module docstring)."""
    d, n = _sizes(cfg)
    heads = cfg.get("num_heads", positive_int)
    qk_dim, v_dim = _width(cfg, d, "qk_dim_factor", heads), _width(cfg, d, "v_dim_factor", heads)
    cfg.check("weight_mode", lambda v: v == "single",
              hint="irc reads the separate projections (weight_mode single, xLSTM-7B's); transformers 5.25 cannot "
                   "build the fused form either (xLSTMPreTrainedModel._init_weights fails on its gate bias)")
    cfg.check("mode", lambda v: v == "inference",
              hint="transformers' training modes take whole chunks only; the inference mode is the model's")
    cfg.check("inference_state_dtype", lambda v: v == "float32", hint="irc keeps the mLSTM state in float32")
    for key in ("norm_reduction_force_float32", "add_out_norm", "tie_word_embeddings"):
        cfg.get(key, boolean)
    cfg.get("chunk_size", positive_int)
    multiple = cfg.get("ffn_round_up_to_multiple_of", positive_int)
    wide = d * cfg.get("ffn_proj_factor", positive_number)
    d_ff = int(((wide + multiple - 1) // multiple) * multiple)  # transformers' round_up_to_next_multiple_of
    eps = cfg.get("eps", positive_number)
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("norm_eps", positive_number), attention=None,
                layers=[LayerSpec(None, None, mixer="mlstm") for _ in range(n)],
                mlp={"kind": "swiglu", "d_ff": d_ff}, tied=False,
                final_softcap=_optional_cap(cfg, "output_logit_soft_cap"), checkpoint="xlstm",
                ssm={"kind": "mlstm", "heads": heads, "qk_dim": qk_dim, "v_dim": v_dim, "eps": eps,
                     "bias": cfg.get("use_bias", boolean),
                     "gate_soft_cap": _optional_cap(cfg, "gate_soft_cap")})
    arch.expand = expand
    return arch


def expand(arch: Arch, origin: str):
    """The decoder through the DSL (see the module docstring)."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps, s, bias = arch.norm_eps, arch.ssm, arch.ssm["bias"]
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer in m.layers(arch.n_layers):
            h = layer.mlstm_block(layer.biased_rms_norm(x, "attn_norm", eps, bias), heads=s["heads"],
                                  qk_dim=s["qk_dim"], v_dim=s["v_dim"], gate_soft_cap=s["gate_soft_cap"], eps=s["eps"],
                                  norm_eps=eps, bias=bias)
            x = x + h
            x = x + layer.xlstm_ffn(layer.biased_rms_norm(x, "mlp_norm", eps, bias), arch.mlp["d_ff"], bias)
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied, softcap=arch.final_softcap)
    return m.graph


FAMILIES = {"xlstm": _xlstm}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS", "expand"]
