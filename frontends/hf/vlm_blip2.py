"""BLIP-2 from Hugging Face folders (``blip-2``): its ViT, the Q-Former that compresses an
image's patches into ``num_query_tokens`` tokens (``frontends.dsl_qformer``), the language
projection, and an OPT text model (``frontends.hf.families_classic``).

=============  =====================================================================================
vision_config  ``blip_2_vision_model`` (``frontends.hf.vision``): class token, learned positions,
               the fused qkv, GELU MLPs; its ``post_layernorm``-ed states feed the Q-Former
qformer_config ``blip_2_qformer``: ``num_hidden_layers`` BERT layers of ``hidden_size``,
               ``num_attention_heads``, ``intermediate_size`` (GELU), LayerNorm ``layer_norm_eps``,
               cross-attention to the patches every ``cross_attention_frequency`` layers; its
               queries' branch only (``use_qformer_text_input``'s text branch is not read: no
               prompt reaches the Q-Former in generation)
text_config    an OPT decoder (``model_type`` opt by default); the image's ``num_query_tokens``
               features take the ``image_token_index`` placeholders, which Blip2Processor puts
               before the prompt's <bos>
=============  =====================================================================================

Weights under transformers' names (the hub's and transformers 5's alike): ``vision_model.``,
``query_tokens``, ``qformer.``, ``language_projection.``, ``language_model.model.`` /
``language_model.lm_head.``; the ViT's biases as the hub's ``q_bias`` / ``v_bias`` or transformers
5's fused ``qkv.bias`` (``frontends.hf.vision``). Refused with
the key: a text model other than a decoder irc's shared loop or the classic families build
(Flan-T5's encoder-decoder BLIP-2s), a vision tower of another type.
"""
from __future__ import annotations

from frontends.dsl_qformer import QFormerSpec
from frontends.hf.config import Config, NestedConfig
from frontends.hf.vision import Reshaped
from frontends.hf.weights import Tensor
from irc.yamlloc import positive_int, positive_number, string

TYPES = ("blip-2",)
DEFAULTS = {"num_query_tokens": 32, "tie_word_embeddings": True}  # Blip2Config (image_token_index: no default)
QFORMER_DEFAULTS = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
                    "hidden_act": "gelu", "layer_norm_eps": 1e-12, "cross_attention_frequency": 2}
GELU = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}
NAMES = ([("model.", "language_model.model."), ("lm_head.", "language_model.lm_head.")], [("", "vision_model.")],
         [("projector.", "")])
# the Q-Former's params (under ``projector.``, after ``layers.{i}.``) -> the checkpoint's (under qformer.encoder.layer.{i}.)
_ATTENTION = {"w": "weight", "b": "bias"}
_LAYER = {**{f"{block}.{kind}{part}": f"{name}.attention.{role}.{_ATTENTION[kind]}"
             for block, name in (("attn", "attention"), ("cross", "crossattention"))
             for kind in "wb" for part, role in zip("qkv", ("query", "key", "value"))},
          **{f"{block}_{what}{suffix}": f"{name}.output.{stored}.{'bias' if suffix else 'weight'}"
             for block, name in (("attn", "attention"), ("cross", "crossattention"))
             for what, stored in (("out", "dense"), ("norm", "LayerNorm")) for suffix in ("", ".bias")},
          "mlp.w_up": "intermediate_query.dense.weight", "mlp.b_up": "intermediate_query.dense.bias",
          "mlp.w_down": "output_query.dense.weight", "mlp.b_down": "output_query.dense.bias",
          "mlp_norm": "output_query.LayerNorm.weight", "mlp_norm.bias": "output_query.LayerNorm.bias"}


def qformer_spec(cfg: Config) -> QFormerSpec:
    """``qformer_config`` (its keys checked) and ``num_query_tokens`` as a ``QFormerSpec``."""
    q = NestedConfig(cfg, "qformer_config", QFORMER_DEFAULTS, "the Q-Former's settings")
    act = q.get("hidden_act", string)
    if act not in GELU:
        raise q.unsupported("hidden_act", act, hint=f"the Q-Former's MLP is GELU: {', '.join(GELU)}")
    return QFormerSpec(layers=q.get("num_hidden_layers", positive_int), width=q.get("hidden_size", positive_int),
                       heads=q.get("num_attention_heads", positive_int), d_ff=q.get("intermediate_size", positive_int),
                       queries=cfg.get("num_query_tokens", positive_int),
                       cross_every=q.get("cross_attention_frequency", positive_int),
                       eps=q.get("layer_norm_eps", positive_number), approximate=GELU[act])


def projector_source(name: str, shape: tuple) -> Tensor:
    """The checkpoint tensor (seen under ``projector.``) of a Q-Former or projection param."""
    if name == "projector.query_tokens":
        return Reshaped("projector.query_tokens", shape)  # stored [1, Q, w]
    if name == "projector.proj" or name == "projector.proj.bias":
        return Tensor(f"projector.language_projection.{'bias' if name.endswith('bias') else 'weight'}")
    if name.startswith("projector.layernorm"):
        return Tensor(f"projector.qformer.layernorm.{'bias' if name.endswith('bias') else 'weight'}")
    index, rest = name[len("projector.layers."):].split(".", 1)
    return Tensor(f"projector.qformer.encoder.layer.{index}.{_LAYER[rest]}")
