"""llama.cpp's hybrid architectures: their keys -> the ``Arch`` that
``frontends.hf.families_hybrid`` (granitemoehybrid, bamba, nemotron_h) and
``frontends.hf.families_composite`` (falcon_h1) build from a config.json, their tensors ->
the same irc params. Where the file is silent, llama.cpp's runtime decides.

=============  ==============================================================================
granitehybrid  Granite-4.0-H and Bamba (the converter writes both so): a layer attends where
               ``attention.head_count_kv`` (one entry a layer) is nonzero, else Mamba-2;
               RoPE only with ``rope.scaling.finetuned`` (default true, as llama.cpp; the
               converter writes true for Bamba, false for Granite-4.0-H: NoPE), rotate-half
               on the first ``rope.dimension_count`` dims of the un-permuted head (Bamba's
               partial RoPE, as transformers rotates it), head_dim = embedding_length /
               head_count (the converter drops Granite's head_dim); MoE where the block has
               ``ffn_gate_inp`` (softmax top-k, renormalised, as llama.cpp), plus a shared
               SwiGLU expert of ``expert_shared_feed_forward_length``; a dense SwiGLU MLP
               elsewhere, as wide as ``expert_shared_feed_forward_length`` (Granite's dense
               MLP is its shared_mlp; llama.cpp loads it at ``feed_forward_length`` and so
               refuses a file where the two differ) or else ``feed_forward_length`` (Bamba); µP:
               ``attention.scale`` (else 1/sqrt(head_dim)), ``embedding_scale``,
               ``residual_scale`` on both branches, logits / ``logit_scale`` (0, 1 or
               missing: none)
nemotron_h     one pre-normed block a layer (every block's norm is ``attn_norm``): Mamba-2
               where ``head_count_kv`` and ``feed_forward_length`` (one entry a layer) are
               both 0, attention (no RoPE) where only the latter is, else a squared-ReLU MLP
               (biases where ``ffn_up.bias`` is); head_dim = ``attention.key_length``; Δ is
               not clamped (the converter writes no ``time_step_limit``; llama.cpp clamps
               nothing; NVIDIA's checkpoints' limit is (0, inf)). ``nemotron_h_moe`` is not read.
falcon-h1      every layer attention ‖ Mamba-2 on one normed input, then a SwiGLU MLP, with
               no multiplier in the graph: the converter folds every µP multiplier into the
               weights (below); full RoPE, rotate-half (NEOX, not permuted); the grouped
               gated norm where ``ssm_norm`` is, applied after the gate (llama.cpp's order,
               transformers' ``mamba_norm_before_gate`` false; the file does not say)
=============  ==============================================================================

Keys read beside ``frontends.gguf.ssm``'s Mamba-2 keys (``ssm.{conv_kernel, inner_size,
state_size, time_step_rank, group_count}``, required as llama.cpp requires them):
``block_count``, ``embedding_length``, ``attention.head_count``, ``attention.head_count_kv``,
``attention.layer_norm_rms_epsilon``, ``feed_forward_length`` (one entry a layer for
nemotron_h), ``attention.key_length`` / ``value_length`` (default embedding_length /
head_count), ``rope.*`` where a layer rotates, ``expert_count`` and ``expert_used_count``
where a block routes. A missing required key is one SpecError naming the file and the key.

What the converter did to the tensors, undone on load (``frontends.gguf.layout``):

- granitehybrid and nemotron_h attention: Q and K rows permuted per head (``undo_permute``,
  inherited from its Llama class, RoPE or not): un-permuted (whole rows, blocks kept);
- Mamba-2 layers, as for mamba2: ``ssm_a`` = -exp(A_log) [H, 1] -> log(-ssm_a) [H]; D [H, 1]
  -> [H]; conv [C, K] -> [C, 1, K]; norm [G, d_inner / G] -> [d_inner]; dt_bias is
  ``ssm_dt.bias``;
- Granite's fused ``input_linear`` (experts and shared MLP) was split by rows into
  ``ffn_{gate,up}_exps`` / ``ffn_{gate,up}_shexp`` (or ``ffn_gate``/``ffn_up`` when dense):
  they are irc's separate gate and up params as they are;
- Falcon-H1's multipliers are folded into the weights (``FalconH1Model.modify_tensors``):
  token_embd x embedding_multiplier, output x lm_head_multiplier, attn_q and attn_v x
  attention_in_multiplier, attn_k x attention_in_multiplier x key_multiplier, attn_output
  x attention_out_multiplier, ssm_in x ssm_in_multiplier with its z, x, B, C and dt rows x
  ssm_multipliers, ssm_out (and its bias) x ssm_out_multiplier, ffn_gate x
  mlp_multipliers[0], ffn_down x mlp_multipliers[1]; no multiplier key is written. Each is a
  linear map's factor, so the folded weights compute the model: irc reads them and the graph
  multiplies by nothing (``frontends.hf.families_composite.FalconH1`` with every factor
  None). The MLP norm is ``blk.N.ffn_norm`` without ``.weight`` (as the converter names it
  and llama.cpp loads it).

Lost by the converter, so not recoverable from the file: a tied Falcon-H1's
embedding_multiplier and lm_head_multiplier (one table serves both, folded once);
Nemotron-H's ``time_step_limit`` (irc, like llama.cpp, clamps Δ nowhere); Granite-4.0-H's
``position_embedding_type`` "rope" (the converter marks every Granite-4.0-H NoPE).
"""
from __future__ import annotations

from functools import partial
from typing import Optional

from frontends.gguf.arch import Hparams, head_size, make_arch, moe_layers, read_rope
from frontends.gguf.ssm import attention_layers, has_tensor, mamba2_config, size
from frontends.hf.config import Arch, Attention, LayerSpec
from frontends.hf.families_composite import FalconH1, falcon_h1_graph
from irc import limits

PERMUTED = ("granitehybrid", "nemotron_h")  # archs whose Q/K rows the converter permutes
LAYER = {  # irc name under layers.{i}. -> GGUF name under blk.{i}., where an arch departs from tensors.LAYER
    "nemotron_h": {"mlp_norm": "attn_norm.weight", "mlp.b_up": "ffn_up.bias", "mlp.b_down": "ffn_down.bias"},
    "falcon-h1": {"mlp_norm": "ffn_norm"},
}


def _dims(hp: Hparams) -> tuple[int, int, int]:
    """(embedding_length, block_count, head_count), within irc's limits."""
    return size(hp, "embedding_length"), size(hp, "block_count", limits.check_layers), size(hp, "attention.head_count")


def _scale(hp: Hparams, key: str) -> Optional[float]:
    """A Granite multiplier: None where missing, 0 (llama.cpp's "off") or 1."""
    value = hp.number(key, None, positive=False)
    if value is not None and value < 0:
        raise hp.error(key, f"expected a non-negative number, got {value!r}")
    return None if value in (None, 0.0, 1.0) else value


def _per_layer(hp: Hparams, key: str, n: int) -> list[int]:
    """One non-negative integer a layer: an array of ``n`` entries, or one value for all."""
    if not hp.gguf.is_array(hp.key(key)):
        return [hp.count(key, minimum=0)] * n
    values = hp.gguf.get(hp.key(key), list)
    if len(values) != n or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
        raise hp.error(key, f"expected {n} non-negative integers (one a layer), got {values[:8]}")
    return values


def _first(flags: list[bool]) -> int:
    return next((i for i, flag in enumerate(flags) if flag), 0)


# ---- granitehybrid -------------------------------------------------------------------------

def describe_granite(hp: Hparams, name: str) -> Arch:
    """granitehybrid: Mamba-2 or attention, then MoE + shared expert or a SwiGLU MLP; µP scales."""
    d, n, heads = _dims(hp)
    attends, kv_heads = attention_layers(hp, n)
    head_dim = head_size(hp, d, heads, kv_heads)
    rope = read_rope(hp, head_dim) if any(attends) and hp.flag("rope.scaling.finetuned", True) else None
    moe_flags = moe_layers(hp, n)
    shared = hp.count("expert_shared_feed_forward_length", 0, minimum=0)
    moe = mlp = None
    if any(moe_flags):
        moe = {"experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count"),
               "d_ff": hp.count("expert_feed_forward_length", None) or hp.count("feed_forward_length"),
               "norm_topk_prob": True}
        if shared:
            moe.update(shared_experts=1, shared_d_ff=shared)
    if not all(moe_flags):
        mlp = {"kind": "swiglu", "d_ff": shared or hp.count("feed_forward_length")}
    layers = [LayerSpec(None, rope, is_moe, mixer="attention") if attend else LayerSpec(None, None, is_moe,
                                                                                        mixer="mamba2")
              for attend, is_moe in zip(attends, moe_flags)]
    ssm = mamba2_config(hp, f"blk.{_first([not a for a in attends])}.") if not all(attends) else None
    scale = hp.number("attention.scale", None, positive=False) or None
    logit_scale = _scale(hp, "logit_scale")
    return make_arch(hp, name, "granitemoehybrid", {"d": d, "layers": n},
                     Attention("gqa", heads, kv_heads, head_dim, scale=scale), layers, mlp, moe=moe, ssm=ssm,
                     embedding_scale=_scale(hp, "embedding_scale"), residual_scale=_scale(hp, "residual_scale"),
                     logits_scale=None if logit_scale is None else 1.0 / logit_scale)


# ---- nemotron_h ----------------------------------------------------------------------------

def describe_nemotron_h(hp: Hparams, name: str) -> Arch:
    """nemotron_h: one block a layer (Mamba-2, attention or squared-ReLU MLP), pre-normed."""
    d, n, heads = _dims(hp)
    attends, kv_heads = attention_layers(hp, n)
    widths = _per_layer(hp, "feed_forward_length", n)
    head_dim = head_size(hp, d, heads, kv_heads)
    is_mlp = [width > 0 for width in widths]
    mixers = [None if ffn else "attention" if attend else "mamba2" for attend, ffn in zip(attends, is_mlp)]
    mlp = None
    if any(is_mlp):
        d_ff = sorted({width for width in widths if width})
        if len(d_ff) > 1:
            raise hp.error("feed_forward_length", f"MLP layers of widths {d_ff}; irc needs one width")
        mlp = {"kind": "relu2", "d_ff": d_ff[0], "bias": has_tensor(hp, f"blk.{_first(is_mlp)}.ffn_up.bias")}
    ssm_layers = [mixer == "mamba2" for mixer in mixers]
    ssm = mamba2_config(hp, f"blk.{_first(ssm_layers)}.") if any(ssm_layers) else None
    layers = [LayerSpec(None, None, mixer=mixer, ffn=mixer is None) for mixer in mixers]
    return make_arch(hp, name, "nemotron_h", {"d": d, "layers": n}, Attention("gqa", heads, kv_heads, head_dim),
                     layers, mlp, ssm=ssm)


# ---- falcon-h1 -----------------------------------------------------------------------------

def describe_falcon_h1(hp: Hparams, name: str) -> Arch:
    """falcon-h1: attention ‖ Mamba-2, then a SwiGLU MLP; the multipliers are in the weights."""
    d, n, heads = _dims(hp)
    kv_heads = hp.count("attention.head_count_kv", heads)
    head_dim = head_size(hp, d, heads, kv_heads)
    eps = hp.number("attention.layer_norm_rms_epsilon")
    ssm = mamba2_config(hp)
    group_size = ssm.pop("norm_group_size")  # the gated norm's settings are FalconH1.ssm_norm
    del ssm["norm_eps"]
    norm = {"eps": eps, "group_size": group_size, "norm_before_gate": False} \
        if has_tensor(hp, "blk.0.ssm_norm.weight") else None
    folded = FalconH1(ssm_in=None, ssm_out=None, ssm_multipliers=[1.0] * 5, attention_in=None, attention_out=None,
                      gate=None, down=None, lm_head=None, embedding=None, ssm_norm=norm,
                      out_bias=has_tensor(hp, "blk.0.ssm_out.bias"))
    rope = read_rope(hp, head_dim)
    layers = [LayerSpec(None, rope, mixer="attention+mamba2") for _ in range(n)]
    return make_arch(hp, name, "falcon_h1", {"d": d, "layers": n}, Attention("gqa", heads, kv_heads, head_dim),
                     layers, {"kind": "swiglu", "d_ff": hp.count("feed_forward_length")}, ssm=ssm,
                     expand=partial(falcon_h1_graph, folded))


FAMILIES = {"granitehybrid": describe_granite, "nemotron_h": describe_nemotron_h, "falcon-h1": describe_falcon_h1}
