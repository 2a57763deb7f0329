"""llama.cpp's state-space architectures: their keys -> the ``Arch`` that
``frontends.hf.families_ssm`` builds from a config.json, their tensors -> irc's
``layers.{i}.ssm.*`` params.

=======  ================================================================================
mamba    Mamba-1; Falcon-Mamba when ``ssm.dt_b_c_rms`` is true: weightless RMS norms on dt,
         B and C at ``layer_norm_rms_epsilon``, as llama.cpp's runtime computes them
         (transformers uses ``mixer_rms_eps``, which the converter does not write)
mamba2   Mamba-2: heads = ``ssm.time_step_rank`` (the converter writes inner_size /
         head_dim there), head_dim = inner_size / heads, ``ssm.group_count`` groups of B
         and C and of the gated RMS norm; Δ is not clamped (the converter writes no
         ``time_step_limit`` and llama.cpp clamps nothing: transformers' default (0, inf))
jamba    Mamba-1 mixers (weighted dt/B/C norms where ``ssm_dt_norm`` is there) or GQA
         attention without RoPE: a layer attends where ``attention.head_count_kv`` (one
         entry a layer) is nonzero, as llama.cpp decides; MoE where the block has
         ``ffn_gate_inp`` (softmax top-k, not renormalised), else the SwiGLU MLP
=======  ================================================================================

Keys read: ``{arch}.ssm.{conv_kernel, inner_size, state_size, time_step_rank}``, and
``ssm.group_count`` for mamba2 (all required, as llama.cpp's loader requires them),
``ssm.dt_b_c_rms`` (default false), ``embedding_length``, ``block_count``,
``attention.layer_norm_rms_epsilon``; the vocabulary is ``vocab_size`` or token_embd's
rows (the converter writes no ``vocab_size`` for these). ``feed_forward_length`` and
``attention.head_count``, which the converter writes as 0 for mamba and mamba2, are read
only for jamba (with ``expert_count``, ``expert_used_count``). Biases follow the tensors
of the first state-space layer: ``ssm_conv1d.bias`` (conv_bias), ``ssm_in.bias`` (in_proj
and out_proj biases, transformers' ``use_bias``); no ``output`` tensor: tied.

Tensors (``LAYER``), and what the converter did to each, undone on load:

=====================  ======================  ==========================================
irc (layers.{i}.)      GGUF (blk.{i}.)         stored -> irc
=====================  ======================  ==========================================
ssm_norm               attn_norm.weight        [d]
ssm.in_proj (_bias)    ssm_in.weight (.bias)   [rows, d]
ssm.conv               ssm_conv1d.weight       [C, K] (squeezed) -> [C, 1, K]
ssm.conv_bias          ssm_conv1d.bias         [C]
ssm.x_proj             ssm_x.weight            [dt_rank + 2N, d_inner]
ssm.dt_proj (_bias)    ssm_dt.weight (.bias)   [d_inner, dt_rank] (+ [d_inner])
ssm.dt_bias            ssm_dt.bias             [H] (Mamba-2's dt_bias, renamed dt_proj.bias)
ssm.A_log              ssm_a                   -exp(A_log) -> log(-ssm_a) (``a_log_from_a``);
                                               Mamba-2 [H, 1] -> [H]
ssm.D                  ssm_d                   [d_inner]; Mamba-2 [H, 1] -> [H]
ssm.norm               ssm_norm.weight         [G, d_inner / G] -> [d_inner] (Mamba-2)
ssm.dt_norm, B_norm,   ssm_dt_norm, ssm_b_norm,
C_norm                 ssm_c_norm (.weight)    Jamba's weighted dt/B/C norms
ssm.out_proj (_bias)   ssm_out.weight (.bias)  [d, d_inner]
=====================  ======================  ==========================================

A reshaped or transformed tensor is read as float32 (it is small: a conv, a vector); the
projections keep their blocks like any other linear weight.
"""
from __future__ import annotations

import numpy as np

from frontends.gguf.arch import Hparams, dense_mlp, head_size, make_arch, moe_layers
from frontends.gguf.tensors import TensorSource
from frontends.hf.config import Arch, Attention, LayerSpec
from irc import limits
from irc.errors import SpecError

LAYER = {  # irc name under layers.{i}. -> GGUF name under blk.{i}.
    "ssm_norm": "attn_norm.weight",
    "ssm.in_proj": "ssm_in.weight", "ssm.in_proj_bias": "ssm_in.bias",
    "ssm.conv": "ssm_conv1d.weight", "ssm.conv_bias": "ssm_conv1d.bias",
    "ssm.x_proj": "ssm_x.weight", "ssm.dt_proj": "ssm_dt.weight", "ssm.dt_proj_bias": "ssm_dt.bias",
    "ssm.dt_bias": "ssm_dt.bias", "ssm.A_log": "ssm_a", "ssm.D": "ssm_d", "ssm.norm": "ssm_norm.weight",
    "ssm.dt_norm": "ssm_dt_norm.weight", "ssm.B_norm": "ssm_b_norm.weight", "ssm.C_norm": "ssm_c_norm.weight",
    "ssm.out_proj": "ssm_out.weight", "ssm.out_proj_bias": "ssm_out.bias",
}
# a DSL argument of layer.mamba / layer.mamba2 -> the GGUF key (after the prefix) behind it
KEYS = {"d_inner": "ssm.inner_size", "state_size": "ssm.state_size", "conv_kernel": "ssm.conv_kernel",
        "dt_rank": "ssm.time_step_rank"}


def a_log_from_a(stored: np.ndarray, name: str, path: str) -> np.ndarray:
    """``A_log`` from llama.cpp's ``ssm_a`` = -exp(A_log): log(-ssm_a), computed in float64
    and rounded once to float32.

    Precision: irc computes A = -exp(A_log) again, and that A is the file's ``ssm_a`` to
    within 2 float32 ulps (measured over A_log in [-10, 8]): the decay the recurrence
    uses is the one llama.cpp uses. ``A_log`` itself is not always the checkpoint's bits:
    the converter's exp rounded it away, so where |A_log| is small (A near -1) the
    recovered A_log differs from the original by up to ~2^-24 absolute (many of its own
    ulps), which is below A's resolution. -0.0 (exp underflow, A_log < -103) gives -inf,
    whose A is -0.0 again. A value that is not negative cannot be -exp(x) and is refused.
    """
    valid = (stored < 0) | ((stored == 0) & np.signbit(stored))
    if not np.all(valid):
        index = tuple(int(i) for i in np.argwhere(~valid)[0])
        raise SpecError(f"tensor {name} holds {stored[index]!r} at {list(index)}; llama.cpp stores "
                        f"ssm_a = -exp(A_log), which is negative", location=path)
    with np.errstate(divide="ignore"):
        return np.log(-stored.astype(np.float64)).astype(np.float32)


def size(hp: Hparams, key: str, check=limits.check_dim) -> int:
    """A required positive count within irc's limits (before anything is built from it)."""
    value = hp.count(key)
    try:
        check(value)
    except limits.LimitError as err:
        raise hp.error(key, err.message, err.hint) from None
    return value


def has_tensor(hp: Hparams, tensor: str) -> bool:
    return tensor in hp.gguf.tensors


def mamba_config(hp: Hparams, block: str = "blk.0.") -> dict:
    """``Layer.mamba`` arguments (the keys of ``frontends.hf.config.mamba_config``); ``block``
    is the first Mamba layer's, whose tensors say which biases and norms there are."""
    weighted = has_tensor(hp, f"{block}ssm_dt_norm.weight")
    config = {"kind": "mamba", "d_inner": size(hp, "ssm.inner_size"), "state_size": size(hp, "ssm.state_size"),
              "conv_kernel": size(hp, "ssm.conv_kernel"), "dt_rank": size(hp, "ssm.time_step_rank"),
              "conv_bias": has_tensor(hp, f"{block}ssm_conv1d.bias"),
              "proj_bias": has_tensor(hp, f"{block}ssm_in.bias"),
              "bcdt_norm": "weighted" if weighted else "plain" if hp.flag("ssm.dt_b_c_rms", False) else None}
    if config["bcdt_norm"] is not None:
        config["norm_eps"] = hp.number("attention.layer_norm_rms_epsilon")
    return config


def mamba2_config(hp: Hparams, block: str = "blk.0.") -> dict:
    """``Layer.mamba2`` arguments (the keys of ``frontends.hf.config.mamba2_config``);
    ``block`` as for ``mamba_config``."""
    d_inner, heads = size(hp, "ssm.inner_size"), size(hp, "ssm.time_step_rank")
    groups = size(hp, "ssm.group_count")
    if d_inner % heads:
        raise hp.error("ssm.time_step_rank", f"{heads} heads do not divide ssm.inner_size {d_inner}",
                       hint="Mamba-2's converter writes inner_size / head_dim as time_step_rank")
    if heads % groups:
        raise hp.error("ssm.group_count", f"{groups} groups do not divide {heads} heads (ssm.time_step_rank)")
    return {"kind": "mamba2", "heads": heads, "head_dim": d_inner // heads, "state_size": size(hp, "ssm.state_size"),
            "groups": groups, "conv_kernel": size(hp, "ssm.conv_kernel"),
            "conv_bias": has_tensor(hp, f"{block}ssm_conv1d.bias"), "proj_bias": has_tensor(hp, f"{block}ssm_in.bias"),
            "dt_min": 0.0, "dt_max": None, "norm_eps": hp.number("attention.layer_norm_rms_epsilon"),
            "norm_group_size": d_inner // groups}


def describe_mamba(hp: Hparams, name: str) -> Arch:
    """mamba (and Falcon-Mamba) and mamba2: every layer x + mixer(norm(x)), no MLP."""
    dims = {"d": size(hp, "embedding_length"), "layers": size(hp, "block_count", limits.check_layers)}
    if hp.arch == "mamba2":
        ssm, model_type = mamba2_config(hp), "mamba2"
    else:
        ssm = mamba_config(hp)
        model_type = "mamba" if ssm["bcdt_norm"] is None else "falcon_mamba"
    layers = [LayerSpec(None, None, mixer=ssm["kind"], ffn=False) for _ in range(dims["layers"])]
    return make_arch(hp, name, model_type, dims, None, layers, None, ssm=ssm)


def attention_layers(hp: Hparams, n: int) -> tuple[list[bool], int]:
    """(which layers attend, their kv head count) from ``attention.head_count_kv``: one entry
    a layer, 0 on a state-space layer (or one value: every layer attends)."""
    key = "attention.head_count_kv"
    if not hp.gguf.is_array(hp.key(key)):
        return [True] * n, hp.count(key)
    counts = hp.gguf.get(hp.key(key), list)
    if len(counts) != n or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
        raise hp.error(key, f"expected {n} non-negative integers (one a layer), got {counts[:8]}")
    kv = sorted({c for c in counts if c})
    if len(kv) > 1:
        raise hp.error(key, f"attention layers with {kv} kv heads; irc needs one count")
    return [c > 0 for c in counts], kv[0] if kv else 1


def describe_jamba(hp: Hparams, name: str) -> Arch:
    """jamba: a Mamba-1 or an attention mixer, then MoE or a SwiGLU MLP, on every layer."""
    d, n = size(hp, "embedding_length"), size(hp, "block_count", limits.check_layers)
    heads = size(hp, "attention.head_count")
    attends, kv_heads = attention_layers(hp, n)
    head_dim = head_size(hp, d, heads, kv_heads)
    moe_flags = moe_layers(hp, n)
    moe = None
    if any(moe_flags):
        moe = {"experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count"),
               "d_ff": hp.count("expert_feed_forward_length", None) or hp.count("feed_forward_length"),
               "norm_topk_prob": hp.flag("expert_weights_norm", False)}
    first_ssm = next((i for i, attend in enumerate(attends) if not attend), 0)
    layers = [LayerSpec(None, None, moe=is_moe, mixer="attention" if attend else "mamba")
              for attend, is_moe in zip(attends, moe_flags)]
    return make_arch(hp, name, "jamba", {"d": d, "layers": n}, Attention("gqa", heads, kv_heads, head_dim), layers,
                     dense_mlp(hp, moe_flags), moe=moe, ssm=mamba_config(hp, f"blk.{first_ssm}."))


def source(arch: Arch, block: str, suffix: str) -> TensorSource:
    """The tensor behind ``layers.{i}.{suffix}`` (``block`` is ``blk.{i}.``), reshaped and
    transformed back as the module docstring says."""
    config = arch.ssm
    kind = config["kind"]
    shape = None
    if suffix == "ssm.conv":
        d_inner = config["d_inner"] if kind == "mamba" else config["heads"] * config["head_dim"]
        channels = d_inner if kind == "mamba" else d_inner + 2 * config["groups"] * config["state_size"]
        shape = (channels, 1, config["conv_kernel"])
    elif kind == "mamba2" and suffix in ("ssm.A_log", "ssm.D"):
        shape = (config["heads"],)
    elif kind == "mamba2" and suffix == "ssm.norm":
        shape = (config["heads"] * config["head_dim"],)
    return TensorSource(block + LAYER[suffix], shape=shape, undo=a_log_from_a if suffix == "ssm.A_log" else None)


FAMILIES = {"mamba": describe_mamba, "mamba2": describe_mamba, "jamba": describe_jamba}
