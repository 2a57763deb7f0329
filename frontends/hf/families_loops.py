"""Recurrent-depth decoders: stacks of layers run several times over, their loop counts config
constants, so each unrolls exactly into a static graph whose every layer invocation has a
KV cache of its own (``past_key_values.{k}.*``, k counting the invocations in the order they
run) and reads the weights of the layer it invokes (one ``Param``, read by every invocation).

=================  ==========================================================================
hrm_text           HRM: two Llama stacks, L and H (weightless RMS norms, MHA with a sigmoid
                   output gate, SwiGLU, each stack ending in a weightless norm), run as
                   ``H_cycles`` x (``L_cycles`` L-passes + one H-pass)
dory               Dory: nGPT layers on the unit sphere (Gemma-2 local / global attention), the
                   middle layers looped ``n_recurrent_loops`` times, a logit-scaled LM head
=================  ==========================================================================

HRM (transformers' ``HrmTextModel``)::

    zH = embed(ids) * embedding_scale;  zL = z_L_init (broadcast)
    repeat H_cycles:  repeat L_cycles: zL = L(zL + zH);   zH = H(zH + zL)
    logits = lm_head(zH)
    a stack S(x): for each layer  x = x + o(attn(rms(x)) * sigmoid(gate(rms(x))));
                                  x = x + down(silu(gate(rms(x))) * up(rms(x)));   S = rms(x)

The config.json transformers writes holds ``num_hidden_layers`` = num_layers_per_stack ·
H_cycles · (L_cycles + 1) (one cache slot per invocation) beside ``num_layers_per_stack``;
a config without ``num_layers_per_stack`` gives the per-stack count as num_hidden_layers
(read as ``HrmTextConfig.__post_init__`` does). ``L_bp_cycles`` is training-only.
``prefix_lm`` changes only a batch given ``token_type_ids``, which irc's graph does not take:
without them transformers' mask is causal, as irc's. Weights as the checkpoint holds them
(transformers' converter splits them on load): ``model.{L,H}_module.layers.{j}.attn.gqkv_proj``
(gate | q | k | v, one linear, its output sliced) and ``mlp.gate_up_proj`` (gate | up) as irc's
``{L,H}_module.layers.{j}.attn.w_gqkv`` / ``mlp.w_gate_up``; ``model.z_L_init`` as ``z_L_init``.

Dory (transformers' ``DoryModel``), with n(x) = x / sqrt(sum(x²) + 1e-6) (an L2 norm, not RMS)::

    layer(x):  h = n(x)
               q, k = n(q_proj h), n(k_proj h) per head;  RoPE;  q = q * (sqk · √hd / init)²
               a = attention(q, k, v_proj h) * sigmoid(gate_proj h * (s_gate · d^¼ / init)²)
               h = h + |lambda_1 · α / init| * (n(o_proj(n(a))) - h);  h = n(h)
               f = down(n(silu(gate h · suv_gate · √d) * (up h · suv_up · √d)))
               x = h + |lambda_2 · α / init| * (n(f) - h)
    model:     input layers;  e = n(x);  repeat loops: x = n(x) + e, recurrent layers;  output layers
    logits = (lm_head n(x)) * (logit_scale / init)

(init = ``initializer_range``, α = ``ngpt_alpha_init``, d = hidden_size, hd = head_dim; every
factor a ``mul`` by a constant, |v| = max(v, -v)). ``recurrent_kv_cache_mode`` "per_loop":
each loop's invocation of a recurrent layer has its own cache; "last_loop": one cache per
recurrent layer, written by the last loop, which the earlier loops read (past plus their
own keys) without writing. transformers' config.json interleaves ``layer_types`` with "mlp"
and doubles the layer counts (``DoryConfig.to_dict``): read back as ``__post_init__`` does.
Weights are read as transformers saves them (``backbone.layers.{j}.*``, ``backbone.embeddings``,
``self_attn.g_proj``); the two-block layout transformers' ``LayerPairCollapse`` also reads
(``layers.{2j}.mixer`` attention, ``layers.{2j+1}.mixer`` MLP, ``attn_alpha``/``mlp_alpha``) is not.
Refused, naming the key: biases (``attention_bias``, ``mlp_bias``), activations other than
SiLU, RoPE types other than default.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import partial
from typing import Optional

from frontends.dsl import Layer, Model
from frontends.dsl_delta import gated_output
from frontends.dsl_rope import emit_rope
from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, rope_dict, read_rope, string_list
from irc.yamlloc import Bad, boolean, layer_count, non_negative_int, number, positive_int, positive_number, size

FULL, SLIDING = "full_attention", "sliding_attention"
L2_EPS = 1e-6  # DoryL2Norm's, fixed

DEFAULTS = {  # transformers 5.25's config classes
    "hrm_text": {
        "vocab_size": 151808, "hidden_size": 1536, "intermediate_size": 4096, "num_hidden_layers": 16,
        "num_attention_heads": 12, "hidden_act": "silu", "max_position_embeddings": 2048, "initializer_range": 0.02,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "head_dim": 128, "H_cycles": 2, "L_cycles": 3, "embedding_scale": None, "prefix_lm": True,
        "num_layers_per_stack": None},
    "dory": {
        "vocab_size": 131072, "hidden_size": 2560, "intermediate_size": 7168, "num_hidden_layers": 36,
        "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256, "hidden_act": "silu",
        "max_position_embeddings": 8192, "initializer_range": 0.0177, "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "sliding_window": 1024, "layer_types": None,
        "ngpt_alpha_init": 0.05, "n_input_layers": 8, "n_recurrent_layers": None, "n_output_layers": 8,
        "n_recurrent_loops": 2, "recurrent_kv_cache_mode": "per_loop"},
}


class _Names(dict):
    """A ``_top`` table whose stack-layer params (``{stack}.layers.{j}.{name}``) name
    ``model.{stack}.layers.{j}.{checkpoint name}``."""

    PARAM = re.compile(r"(L_module|H_module)\.layers\.(\d+)\.(.+)")

    def _name(self, key) -> Optional[str]:
        match = self.PARAM.fullmatch(key) if isinstance(key, str) else None
        if match is None or match.group(3) not in HRM_LAYER:
            return None
        return f"model.{match.group(1)}.layers.{match.group(2)}.{HRM_LAYER[match.group(3)]}"

    def __contains__(self, key) -> bool:
        return super().__contains__(key) or self._name(key) is not None

    def __getitem__(self, key):
        return self._name(key) or super().__getitem__(key)


HRM_LAYER = {"attn.w_gqkv": "attn.gqkv_proj.weight", "attn.wo": "attn.o_proj.weight",
             "mlp.w_gate_up": "mlp.gate_up_proj.weight", "mlp.w_down": "mlp.down_proj.weight"}
TOP = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}
LAYOUTS = {
    "hrm_text": {"_top": _Names({**TOP, "z_L_init": "model.z_L_init"})},
    # as transformers saves Dory (its converter's names: backbone., embeddings, g_proj)
    "dory": {"attn.w_gate": "self_attn.g_proj.weight", "attn.sqk": "self_attn.sqk",
             "attn.s_gate": "self_attn.s_gate", "mlp.suv_gate": "mlp.suv_gate", "mlp.suv_up": "mlp.suv_up",
             "lambda_1": "lambda_1", "lambda_2": "lambda_2", "_prefix": "backbone.layers.",
             "_top": {"embed": "backbone.embeddings.weight", "lm_head": "lm_head.weight",
                      "logit_scale": "lm_head.logit_scale"}},
}


# ---- shared pieces --------------------------------------------------------------------------

def _linear(m: Model, x, weight, name: str):
    return m.emit("linear", [x, weight, None], None, name)[0]


def _const(m: Model, value: float, name: str):
    return m.emit("constant", [], {"value": float(value)}, name)[0]


def l2_norm(m: Model, x, name: str, heads: Optional[int] = None, head_dim: Optional[int] = None):
    """x / sqrt(sum(x²) + 1e-6) over the last axis, or per head of x [B, T, heads·head_dim]."""
    if heads is not None:
        x = m.emit("reshape", [x], {"shape": ["B", "T", heads, head_dim]}, f"{name}_heads")[0]
    square = m.emit("mul", [x, x], None, f"{name}_square")[0]
    total = m.emit("reduce_sum", [square], {"axes": [-1], "keepdims": True}, f"{name}_sum_square")[0]
    shifted = m.emit("add", [total, _const(m, L2_EPS, f"{name}_eps")], None, f"{name}_sum_square_eps")[0]
    out = m.emit("mul", [x, m.emit("rsqrt", [shifted], None, f"{name}_inv_norm")[0]], None, f"{name}_out")[0]
    if heads is not None:
        out = m.emit("reshape", [out], {"shape": ["B", "T", heads * head_dim]}, f"{name}_flat")[0]
    return out


def attend(layer, q, k, v, a: Attention, rope, window: Optional[int] = None, past=None, keep: bool = True):
    """The attention op over the invocation's cache: its own ``past_key_values.{i}`` (``past``
    None), or ``past`` (key, value) read without writing (``keep`` False: no presents)."""
    m, p, i = layer.model, layer.prefix, layer.index
    mask, positions = m._context()
    if rope is not None:
        q = emit_rope(m, q, positions, rope, a.heads, a.head_dim, f"{p}q_rope")
        k = emit_rope(m, k, positions, rope, a.kv_heads, a.head_dim, f"{p}k_rope")
    past_key, past_value = past if past is not None else m._past(i, a.kv_heads, a.head_dim, a.head_dim)
    attrs = {"heads": a.heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim, "v_head_dim": None, "causal": True,
             "window": window, "softcap": None, "scale": a.scale}
    names = [f"{p}attn", f"present.{i}.key", f"present.{i}.value"] if keep else \
        [f"{p}attn", f"{p}read_key", f"{p}read_value"]
    out, key, value = m.emit("attention", [q, k, v, mask, past_key, past_value], attrs, names)
    if keep:
        m._presents += [key.value, value.value]
        kind = "mha" if a.kv_heads == a.heads else "mqa" if a.kv_heads == 1 else "gqa"
        layer._note_attention(kind, a.heads, a.kv_heads, a.head_dim, a.head_dim, window, None, a.scale, rope)
    return out


def _silu(cfg: Config) -> None:
    cfg.check("hidden_act", lambda v: v == "silu", hint="this family's MLP is SwiGLU")


def _no_bias(cfg: Config) -> None:
    for key in ("attention_bias", "mlp_bias"):
        cfg.check(key, lambda v: not v, hint="irc's layers here have no such bias")


def _default_rope(cfg: Config, head_dim: int, layer_type: Optional[str] = None, base: float = 10000.0):
    params, key = rope_dict(cfg, layer_type)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise cfg.unsupported(f"{key}.rope_type", kind, hint="irc reads this family's default RoPE only")
    return read_rope(cfg, head_dim, params, key, default_base=base)


# ---- HRM ---------------------------------------------------------------------------------------

@dataclass
class Hrm:
    per_stack: int
    h_cycles: int
    l_cycles: int
    embedding_scale: float
    rope: object = None


def _hrm(cfg: Config, name: str, model_type: str) -> Arch:
    """HRM-Text: the L and H stacks unrolled H_cycles x (L_cycles + 1) times."""
    _silu(cfg)
    _no_bias(cfg)
    d = cfg.get("hidden_size", size)
    h_cycles, l_cycles = cfg.get("H_cycles", positive_int), cfg.get("L_cycles", positive_int)
    n = cfg.get("num_hidden_layers", positive_int)
    per_stack = cfg.get("num_layers_per_stack", positive_int, None)
    if per_stack is None:
        per_stack = n
    elif per_stack * h_cycles * (l_cycles + 1) != n:
        raise cfg.error("num_hidden_layers", f"{n} is not num_layers_per_stack x H_cycles x (L_cycles + 1) = "
                                             f"{per_stack * h_cycles * (l_cycles + 1)}",
                        hint="transformers counts one cache slot per layer invocation")
    invocations = per_stack * h_cycles * (l_cycles + 1)
    try:
        layer_count(invocations)
    except Bad as err:
        raise cfg.error("num_hidden_layers", f"{invocations} layer invocations: {err}") from None
    heads = cfg.get("num_attention_heads", size)
    head_dim = cfg.get("head_dim", positive_int)
    scale = cfg.get("embedding_scale", positive_number, None)
    if scale is None:
        scale = 1.0 / cfg.get("initializer_range", positive_number)
    rope = _default_rope(cfg, head_dim)
    settings = Hrm(per_stack=per_stack, h_cycles=h_cycles, l_cycles=l_cycles, embedding_scale=scale, rope=rope)
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=invocations, norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=Attention("mha", heads, heads, head_dim, scale=head_dim ** -0.5),
                layers=[LayerSpec(None, rope) for _ in range(invocations)],
                mlp={"kind": "swiglu", "d_ff": cfg.get("intermediate_size", positive_int)},
                tied=cfg.get("tie_word_embeddings", boolean), checkpoint="hrm_text", embedding_scale=scale,
                expand=partial(_hrm_graph, settings))


def _hrm_weights(m: Model, arch: Arch, stack: str, j: int) -> dict:
    """One stack layer's params, as the checkpoint holds them fused: gate|q|k|v and gate|up."""
    a, d, f = arch.attention, arch.d_model, arch.mlp["d_ff"]
    p = f"{stack}.layers.{j}."
    return {"gqkv": m.param(f"{p}attn.w_gqkv", (4 * a.heads * a.head_dim, d)),
            "wo": m.param(f"{p}attn.wo", (d, a.heads * a.head_dim)),
            "gate_up": m.param(f"{p}mlp.w_gate_up", (2 * f, d)), "down": m.param(f"{p}mlp.w_down", (d, f))}


def _hrm_layer(layer, x, w: dict, arch: Arch, rope):
    m, p, eps, f = layer.model, layer.prefix, arch.norm_eps, arch.mlp["d_ff"]
    q_dim = arch.attention.heads * arch.attention.head_dim
    h = m.plain_rms_norm(x, f"{p}attn_norm", eps)
    g, q, k, v = layer._split(_linear(m, h, w["gqkv"], f"{p}gqkv"), [q_dim] * 4, ["gate", "q", "k", "v"])
    out = gated_output(layer, attend(layer, q, k, v, arch.attention, rope), g)
    x = m.add(x, _linear(m, out, w["wo"], f"{p}attn_out"), f"{p}attn_residual")
    h = m.plain_rms_norm(x, f"{p}mlp_norm", eps)
    gate, up = layer._split(_linear(m, h, w["gate_up"], f"{p}mlp_gate_up"), [f, f], ["mlp_gate", "mlp_up"])
    hidden = m.emit("mul", [m.emit("silu", [gate], None, f"{p}mlp_act")[0], up], None, f"{p}mlp_hidden")[0]
    layer._note_mlp("swiglu", f)
    return m.add(x, _linear(m, hidden, w["down"], f"{p}mlp_out"), f"{p}mlp_residual")


def _hrm_graph(s: Hrm, arch: Arch, origin: str):
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    rope = dsl_rope(s.rope)
    with m.at(origin):
        z_high = m.embed(m.input_ids(), scale=s.embedding_scale)
        weights = {stack: [_hrm_weights(m, arch, stack, j) for j in range(s.per_stack)]
                   for stack in ("L_module", "H_module")}
        z_low = m.param("z_L_init", (arch.d_model,))
        invocations = iter(m.layers(arch.n_layers))

        def run(stack: str, x, tag: str):
            for j in range(s.per_stack):
                x = _hrm_layer(next(invocations), x, weights[stack][j], arch, rope)
            return m.plain_rms_norm(x, f"{tag}_norm", arch.norm_eps)

        for cycle in range(s.h_cycles):
            for inner in range(s.l_cycles):
                z_low = run("L_module", m.add(z_high, z_low, f"h{cycle}.l{inner}.in"), f"h{cycle}.l{inner}")
            z_high = run("H_module", m.add(z_high, z_low, f"h{cycle}.in"), f"h{cycle}")
        m.logits(z_high, tied=arch.tied)
    return m.graph


# ---- Dory -----------------------------------------------------------------------------------------

@dataclass
class Dory:
    n_input: int
    n_recurrent: int
    n_output: int
    loops: int
    last_loop: bool
    init: float
    alpha: float
    types: list = field(default_factory=list)
    ropes: dict = field(default_factory=dict)
    window: Optional[int] = None


def _dory_counts(cfg: Config) -> tuple[list, int, int, int, int]:
    """(layer types, n, input, recurrent, output layers), undoing to_dict's doubling."""
    n = cfg.get("num_hidden_layers", positive_int)
    n_in, n_out = cfg.get("n_input_layers", non_negative_int), cfg.get("n_output_layers", non_negative_int)
    n_rec = cfg.get("n_recurrent_layers", non_negative_int, None)
    types = cfg.get("layer_types", string_list, None)
    if types is not None and "mlp" in types:
        types, n, n_in, n_out = types[::2], n // 2, n_in // 2, n_out // 2
        n_rec = None if n_rec is None else n_rec // 2
    if types is None:
        types = [FULL if (i + 1) % 4 == 0 else SLIDING for i in range(n)]
    if len(types) != n:
        raise cfg.error("layer_types", f"has {len(types)} entries for {n} layers")
    for kind in types:
        if kind not in (FULL, SLIDING):
            raise cfg.unsupported("layer_types", kind, hint=f"layer types: {FULL}, {SLIDING}")
    n_rec = n - n_in - n_out if n_rec is None else n_rec
    if min(n_in, n_rec, n_out) < 0 or n_in + n_rec + n_out != n:
        raise cfg.error("n_recurrent_layers", f"{n_in} input + {n_rec} recurrent + {n_out} output layers are not "
                                              f"num_hidden_layers {n}")
    return types, n, n_in, n_rec, n_out


def _dory(cfg: Config, name: str, model_type: str) -> Arch:
    """Dory: nGPT layers, the middle ones looped."""
    _silu(cfg)
    _no_bias(cfg)
    d = cfg.get("hidden_size", size)
    types, n, n_in, n_rec, n_out = _dory_counts(cfg)
    loops = cfg.get("n_recurrent_loops", positive_int)
    mode = cfg.raw("recurrent_kv_cache_mode")
    if mode not in ("per_loop", "last_loop"):
        raise cfg.unsupported("recurrent_kv_cache_mode", mode, hint="per_loop or last_loop")
    heads = cfg.get("num_attention_heads", size)
    kv_heads = cfg.get("num_key_value_heads", size)
    if heads % kv_heads:
        raise cfg.error("num_key_value_heads", f"{heads} heads are not divisible by {kv_heads} kv heads")
    head_dim = cfg.get("head_dim", positive_int)
    bases = {SLIDING: 1e4, FULL: 1e7}
    has_rope = cfg.data.get("rope_parameters") is not None
    ropes = {t: _default_rope(cfg, head_dim, t if has_rope else None, bases[t]) for t in set(types)}
    window = cfg.get("sliding_window", positive_int) if SLIDING in types else None
    settings = Dory(n_input=n_in, n_recurrent=n_rec, n_output=n_out, loops=loops, last_loop=mode == "last_loop",
                    init=cfg.get("initializer_range", positive_number), alpha=cfg.get("ngpt_alpha_init", number),
                    types=types, ropes=ropes, window=window)
    invocations = n + (0 if settings.last_loop else (loops - 1) * n_rec)
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=L2_EPS,
                attention=Attention("gqa", heads, kv_heads, head_dim, scale=head_dim ** -0.5),
                layers=[LayerSpec(window if t == SLIDING else None, ropes[t]) for t in types],
                mlp={"kind": "swiglu", "d_ff": cfg.get("intermediate_size", positive_int)},
                tied=cfg.get("tie_word_embeddings", boolean), checkpoint="dory",
                expand=partial(_dory_graph, settings, invocations))


def _times(m: Model, v, factor: float, name: str):
    return m.emit("mul", [v, _const(m, factor, f"{name}_factor")], None, name)[0]


def _square(m: Model, v, factor: float, name: str):
    """(v · factor)²."""
    t = _times(m, v, factor, f"{name}_scaled")
    return m.emit("mul", [t, t], None, name)[0]


def _rate(m: Model, v, factor: float, name: str):
    """|v · factor| as max(t, -t)."""
    t = _times(m, v, factor, f"{name}_scaled")
    return m.emit("maximum", [t, m.emit("neg", [t], None, f"{name}_neg")[0]], None, name)[0]


def _dory_weights(m: Model, arch: Arch, j: int) -> dict:
    a, d, f = arch.attention, arch.d_model, arch.mlp["d_ff"]
    p, q_dim, kv_dim = f"layers.{j}.", a.heads * a.head_dim, a.kv_heads * a.head_dim
    shapes = {"attn.wq": (q_dim, d), "attn.wk": (kv_dim, d), "attn.wv": (kv_dim, d), "attn.w_gate": (q_dim, d),
              "attn.wo": (d, q_dim), "attn.sqk": (q_dim,), "attn.s_gate": (q_dim,), "mlp.w_gate": (f, d),
              "mlp.w_up": (f, d), "mlp.w_down": (d, f), "mlp.suv_gate": (f,), "mlp.suv_up": (f,),
              "lambda_1": (d,), "lambda_2": (d,)}
    return {k: m.param(f"{p}{k}", shape) for k, shape in shapes.items()}


def _dory_layer(layer, x, w: dict, s: Dory, arch: Arch, kind: str, past=None, keep: bool = True):
    m, p, a, d = layer.model, layer.prefix, arch.attention, arch.d_model
    h = l2_norm(m, x, f"{p}attn_norm")
    q = l2_norm(m, _linear(m, h, w["attn.wq"], f"{p}q"), f"{p}q_norm", a.heads, a.head_dim)
    k = l2_norm(m, _linear(m, h, w["attn.wk"], f"{p}k"), f"{p}k_norm", a.kv_heads, a.head_dim)
    v = _linear(m, h, w["attn.wv"], f"{p}v")
    rope = dsl_rope(s.ropes[kind])
    if rope is not None:
        mask, positions = m._context()
        q = emit_rope(m, q, positions, rope, a.heads, a.head_dim, f"{p}q_rope")
        k = emit_rope(m, k, positions, rope, a.kv_heads, a.head_dim, f"{p}k_rope")
    q = m.emit("mul", [q, _square(m, w["attn.sqk"], a.head_dim ** 0.5 / s.init, f"{p}q_scale")], None,
               f"{p}q_scaled")[0]
    window = s.window if kind == SLIDING else None
    out = attend(layer, q, k, v, a, None, window, past, keep)
    gate = m.emit("mul", [_linear(m, h, w["attn.w_gate"], f"{p}gate"),
                          _square(m, w["attn.s_gate"], d ** 0.25 / s.init, f"{p}gate_scale")], None, f"{p}gate_in")[0]
    out = gated_output(layer, out, gate)
    out = l2_norm(m, _linear(m, l2_norm(m, out, f"{p}attn_sub_norm"), w["attn.wo"], f"{p}attn_out"),
                  f"{p}post_attn_norm")
    h = _interpolate(m, h, out, _rate(m, w["lambda_1"], s.alpha / s.init, f"{p}attn_rate"), f"{p}attn")
    h = l2_norm(m, h, f"{p}mlp_norm")
    suv = d ** 0.5
    g = m.emit("mul", [_linear(m, h, w["mlp.w_gate"], f"{p}mlp_gate"), _times(m, w["mlp.suv_gate"], suv,
                                                                               f"{p}suv_gate")], None,
               f"{p}mlp_gate_scaled")[0]
    u = m.emit("mul", [_linear(m, h, w["mlp.w_up"], f"{p}mlp_up"), _times(m, w["mlp.suv_up"], suv, f"{p}suv_up")],
               None, f"{p}mlp_up_scaled")[0]
    f = m.emit("mul", [m.emit("silu", [g], None, f"{p}mlp_act")[0], u], None, f"{p}mlp_hidden")[0]
    f = l2_norm(m, _linear(m, l2_norm(m, f, f"{p}ffn_sub_norm"), w["mlp.w_down"], f"{p}mlp_out"),
                f"{p}post_mlp_norm")
    layer._note_mlp("swiglu", arch.mlp["d_ff"])
    return _interpolate(m, h, f, _rate(m, w["lambda_2"], s.alpha / s.init, f"{p}mlp_rate"), f"{p}mlp")


def _interpolate(m: Model, h, target, rate, name: str):
    """h + rate · (target - h)."""
    step = m.emit("mul", [rate, m.emit("sub", [target, h], None, f"{name}_delta")[0]], None, f"{name}_step")[0]
    return m.emit("add", [h, step], None, f"{name}_residual")[0]


def _dory_graph(s: Dory, invocations: int, arch: Arch, origin: str):
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a = arch.attention
    with m.at(origin):
        x = m.embed(m.input_ids())
        weights = [_dory_weights(m, arch, j) for j in range(arch.n_layers)]
        layers = iter(list(m.layers(invocations)))
        for j in range(s.n_input):
            x = _dory_layer(next(layers), x, weights[j], s, arch, s.types[j])
        start = s.n_input
        entry = l2_norm(m, x, "loop_entry")
        pasts = {}
        for loop in range(s.loops):
            x = m.add(l2_norm(m, x, f"loop{loop}_norm"), entry, f"loop{loop}_in")
            reading = s.last_loop and loop < s.loops - 1
            for j in range(start, start + s.n_recurrent):
                if s.last_loop and j not in pasts:
                    pasts[j] = m._past(j, a.kv_heads, a.head_dim, a.head_dim)
                if reading:
                    layer = Layer(m, j)
                    layer.prefix = f"loop{loop}.layers.{j}."
                else:
                    layer = next(layers)
                x = _dory_layer(layer, x, weights[j], s, arch, s.types[j], pasts.get(j), not reading)
        for j in range(start + s.n_recurrent, arch.n_layers):
            x = _dory_layer(next(layers), x, weights[j], s, arch, s.types[j])
        x = l2_norm(m, x, "norm")
        head = m._graph.params["embed"] if arch.tied else m.param("lm_head", (arch.vocab_size, arch.d_model))
        raw = _linear(m, x, head, "logits_unscaled")
        logits = m.emit("mul", [raw, _times(m, m.param("logit_scale", (arch.vocab_size,)), 1.0 / s.init,
                                            "logit_scale_scaled")], None, "logits")[0]
        m.meta["tied_embeddings"], m.meta["final_softcap"] = bool(arch.tied), None
        m._graph.outputs = [logits.value] + m._presents
    return m.graph



FAMILIES = {"hrm_text": _hrm, "dory": _dory}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS", "attend", "l2_norm"]
