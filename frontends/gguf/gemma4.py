"""llama.cpp's ``gemma4`` (Gemma-4's text model, dense): its keys -> the ``Gemma4Arch``
``frontends.hf.families_gemma4`` builds from a config.json (its decoder loop), its tensors ->
the same irc params.

Keys (``Gemma4Model.set_gguf_parameters``): ``attention.sliding_window_pattern`` (true: a
sliding layer; absent: five sliding to one full; the last layer full, as transformers makes
it), ``attention.key_length`` the full layers' head size and ``attention.key_length_swa`` the
sliding layers', ``attention.head_count_kv`` one value or one per layer (one per layer type),
``attention.shared_kv_layers`` (the last that many layers reuse the K/V of the last earlier
layer of their type), ``feed_forward_length`` one width or one per layer (the double-wide MLPs
of the shared layers), ``embedding_length_per_layer_input`` (0: no per-layer embeddings; the
table's rows from ``per_layer_token_embd``), ``rope.freq_base`` (full layers, default 1e6) and
``rope.freq_base_swa`` (sliding, default 1e4), ``final_logit_softcapping``. Full layers rotate
by proportional RoPE: the converter writes its partial rotation as ``rope_freqs`` (1 for the
rotated frequency pairs, 1e30 for the others; irc reads partial_rotary_factor =
2 · rotated / key_length); without ``rope_freqs`` a full layer rotates its whole head.
A full layer with its own K/V and no ``attn_v`` has k = v (``attention_k_eq_v``; the converter
writes no flag). As transformers and llama.cpp compute Gemma-4: plain norm weights (none
shifted), q and k RMS-normed per head, v without a weight, attention unscaled, sandwich
norms, sqrt(d) embedding scale, GeGLU (tanh), ``layer_output_scale`` times each layer's output.

What the file cannot say, so irc reads what llama.cpp runs: the activation (GELU's tanh form,
Gemma-4's ``gelu_pytorch_tanh``), and the proportional RoPE's ``factor`` (1; the converter
writes none). Refused, naming the key or tensor: the MoE form (``ffn_gate_inp`` and the fused
``ffn_gate_up_exps``; irc reads the MoE from the Hugging Face checkpoint), a sliding rotation
other than the whole head (``rope.dimension_count_swa``), a ``rope_freqs`` that is not 1s then
1e30s, layers of one type with different kv heads, ``shared_kv_layers`` leaving a shared layer
without an earlier layer of its type, per-layer lists of the wrong length.
"""
from __future__ import annotations

import numpy as np

from frontends.gguf.arch import Hparams, _vocab, window_layers
from frontends.gguf.gemma3n import TOP as PLE_TOP, _per_layer, _tensor_rows, kv_sources
from frontends.gguf.tensors import TensorSource
from frontends.hf.config import Arch, Attention, LayerSpec, RopeSpec
from frontends.hf.families_common import FULL, SLIDING
from irc import limits


def _head_sizes(hp: Hparams) -> tuple[int, int]:
    full = hp.count("attention.key_length")
    swa = hp.count("attention.key_length_swa", full)
    for key, value in (("attention.key_length", full), ("attention.key_length_swa", swa)):
        if hp.count(key.replace("key", "value"), value) != value:
            raise hp.error(key.replace("key", "value"), f"differs from {key} {value}: Gemma-4 has one head size "
                                                        "for keys and values")
        try:
            limits.check_dim(value)
        except limits.LimitError as err:
            raise hp.error(key, err.message, err.hint) from None
    return full, swa


def _full_rope(hp: Hparams, head_dim: int) -> RopeSpec:
    base = hp.number("rope.freq_base", 1e6)
    entry = hp.gguf.tensors.get("rope_freqs.weight")
    if entry is None:
        return RopeSpec(base, "half")
    freqs = np.asarray(entry.data, dtype=np.float32).reshape(-1)
    rotated = int(np.sum(freqs == 1.0))
    if freqs.shape != (head_dim // 2,) or not (freqs[:rotated] == 1.0).all() or not (freqs[rotated:] >= 1e29).all() \
            or rotated == 0:
        raise hp.gguf.error("rope_freqs.weight", f"{list(freqs.shape)} values are not proportional RoPE's 1s then "
                                                 f"1e30s over {head_dim // 2} frequency pairs")
    return RopeSpec(base, "half", {"kind": "proportional", "factor": 1.0,
                                   "partial_rotary_factor": 2 * rotated / head_dim})


def describe_gemma4(hp: Hparams, name: str) -> Arch:
    from frontends.hf.families_gemma4 import Gemma4Arch, Gemma4Layer, decoder

    gguf = hp.gguf
    moe = next((t for t in sorted(gguf.tensors) if t.endswith(("ffn_gate_inp.weight", "ffn_gate_up_exps.weight"))),
               None)
    if moe is not None:
        raise gguf.error(moe, "Gemma-4's MoE form is not read from GGUF", hint="compile the Hugging Face checkpoint")
    d, heads, n = hp.count("embedding_length"), hp.count("attention.head_count"), hp.count("block_count")
    for key, value, check in (("block_count", n, limits.check_layers), ("embedding_length", d, limits.check_dim),
                              ("attention.head_count", heads, limits.check_dim)):
        try:  # before anything per layer or per head is made (irc.limits)
            check(value)
        except limits.LimitError as err:
            raise hp.error(key, err.message, err.hint) from None
    local = window_layers(hp, n, 6)
    local = local[:-1] + [False]  # transformers makes the last layer full
    full_dim, swa_dim = _head_sizes(hp)
    if hp.count("rope.dimension_count_swa", swa_dim) != swa_dim:
        raise hp.error("rope.dimension_count_swa", f"rotates {hp.count('rope.dimension_count_swa')} of {swa_dim} "
                                                   "dims: Gemma-4's sliding layers rotate the whole head")
    kv = [int(v) for v in _per_layer(hp, "attention.head_count_kv", n, default=[heads] * n)]
    shapes = {}
    for i, is_local in enumerate(local):
        kind = SLIDING if is_local else FULL
        if shapes.setdefault(kind, kv[i]) != kv[i]:
            raise hp.error("attention.head_count_kv", f"layer {i} ({kind}) has {kv[i]} kv heads, another "
                                                      f"{kind} layer {shapes[kind]}")
        if kv[i] < 1 or heads % kv[i]:
            raise hp.error("attention.head_count_kv", f"{heads} heads are not divisible by {kv[i]} kv heads "
                                                      f"(layer {i})")
    shares = kv_sources(hp, local)
    d_ff = [int(v) for v in _per_layer(hp, "feed_forward_length", n)]
    window = hp.count("attention.sliding_window") if any(local) else None
    ropes = {SLIDING: RopeSpec(hp.number("rope.freq_base_swa", 1e4), "half"), FULL: _full_rope(hp, full_dim)}
    own_full = [i for i in range(n) if not local[i] and shares[i] is None]
    k_eq_v = bool(own_full) and f"blk.{own_full[0]}.attn_v.weight" not in gguf.tensors
    layers = [Gemma4Layer(SLIDING if is_local else FULL, kv[i], swa_dim if is_local else full_dim,
                          k_eq_v and not is_local, shares[i], d_ff[i], window if is_local else None,
                          ropes[SLIDING if is_local else FULL]) for i, is_local in enumerate(local)]
    width = hp.count("embedding_length_per_layer_input", 0, minimum=0)
    first = layers[0]
    return Gemma4Arch(
        name=name, model_type="gemma4_text", dtype="f32", vocab_size=_vocab(hp), d_model=d,
        n_layers=n, norm_eps=hp.number("attention.layer_norm_rms_epsilon"),
        attention=Attention("gqa", heads, first.kv_heads, first.head_dim, qk_norm=True, scale=1.0),
        layers=[LayerSpec(g.window, g.rope) for g in layers], mlp={"kind": "geglu", "d_ff": d_ff[0],
                                                                    "approximate": "tanh"},
        sandwich=True, tied="output.weight" not in gguf.tensors,
        final_softcap=hp.number("final_logit_softcapping", None), embedding_scale=d ** 0.5, checkpoint="gemma4",
        expand=decoder, gemma4_layers=layers, ple_width=width,
        ple_vocab=_tensor_rows(hp, "per_layer_token_embd.weight") if width else 0, approximate="tanh")


LAYER = {"ple_gate": "inp_gate.weight", "ple_proj": "proj.weight", "ple_norm": "post_norm.weight",
         "layer_scalar": "layer_output_scale.weight"}


def source(arch, gguf, param: str, block, suffix):
    """The tensor behind ``param`` where Gemma-4 departs from ``frontends.gguf.tensors``
    (None: the common layout holds)."""
    if param in PLE_TOP:
        return TensorSource(PLE_TOP[param])
    if suffix in LAYER:
        return TensorSource(block + LAYER[suffix])
    return None


FAMILIES = {"gemma4": describe_gemma4}
