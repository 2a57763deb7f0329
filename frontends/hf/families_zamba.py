"""Zamba (v1, ``model_type`` zamba): Mamba-1 layers, and at the "hybrid" layers first one
shared transformer block over concat(x, embeddings) (Zamba2's is ``families_composite``).

Zamba, a hybrid layer i (the block's weights are the first hybrid layer's, when tied)::

    s = shared(concat(x, e)),  e = embed(ids)    attention (no RoPE), then a gated MLP, no residual
    x = x + mamba(input_layernorm(x + linear_i(s)))
    a Mamba layer:  x = x + mamba(input_layernorm(x))

Its Mamba-1 mixer has ``n_mamba_heads`` heads: in_proj and the depthwise convolution run over
all d_inner = mamba_expand · hidden_size channels, then each head (d_inner / heads channels)
has its own x_proj, dt_proj, A_log and D, so its own Δ, B and C: one ``selective_scan`` per
head over its slice of the channels and of the layer's state [B, d_inner, N] (transformers'
[B, heads, d_inner / heads, N], flattened), the heads' outputs and states concatenated.
transformers splits in_proj's output interleaved (``view(B, -1, 2, T)``: even rows x, odd
rows z); irc's ``ssm.in_proj`` holds the even rows, then the odd ones (read so on load), and
each head's param ``ssm.{x_proj,dt_proj,dt_proj_bias,A_log,D}.{h}`` is row h of the stacked
tensor. Attention: q, k and v read 2·hidden_size features (``attention_hidden_size``),
``attention_head_dim`` (default 2·hidden_size / heads), scale (head_dim / 2)^-1/2.

Tied (``tie_word_embeddings``, the default) transformers ties every hybrid layer's block to
the first one's, so every use reads one set of params ``layers.{first}.shared.*``; untied,
each hybrid layer keeps its own (``layers.{i}.shared.*``), as transformers does. Refused,
naming the key: ``hidden_mamba_act`` other than SiLU, an ``attention_hidden_size`` other
than 2·hidden_size, MLP activations other than gelu / gelu_pytorch_tanh / gelu_new / silu,
a ``num_hidden_layers`` that disagrees with ``layers_block_type``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import partial

from frontends.dsl import Model
from frontends.dsl_hybrid import glu, norm_with, scope, shared_attention
from frontends.hf.config import Arch, Attention, Config, LayerSpec, string_list
from frontends.hf.weights import Checkpoint, Tensor, View
from irc.errors import SpecError
from irc.yamlloc import Bad, boolean, layer_count, non_negative_int, positive_int, positive_number, size

HYBRID, MAMBA = "hybrid", "linear_attention"
GATES = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "silu": "silu"}
HEAD_PARAMS = ("x_proj", "dt_proj", "dt_proj_bias", "A_log", "D")
CHECKPOINT_HEAD = {"x_proj": "x_proj_weight", "dt_proj": "dt_proj_weight", "dt_proj_bias": "dt_proj_bias",
                   "A_log": "A_log", "D": "D"}

DEFAULTS = {  # transformers 5.25's ZambaConfig
    "zamba": {
        "vocab_size": 32000, "tie_word_embeddings": True, "hidden_size": 3712, "attention_hidden_size": None,
        "intermediate_size": 14848, "num_hidden_layers": 76, "num_attention_heads": 16, "attention_head_dim": None,
        "num_key_value_heads": 16, "n_mamba_heads": 2, "hidden_act": "gelu", "hidden_mamba_act": "silu",
        "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "attn_layer_period": 6, "attn_layer_offset": 4,
        "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": "auto",
        "mamba_conv_bias": True, "mamba_proj_bias": False, "layers_block_type": None},
}


class HeadRow(Tensor):
    """Row ``head`` of a per-head stacked tensor [H, ...] (Zamba's ``x_proj_weight`` ...)."""

    def __init__(self, name: str, head: int):
        super().__init__(name)
        self.head = head

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        full = checkpoint.info(self.name)[1]
        if len(full) < 2 or full[0] <= self.head:
            raise SpecError(f"tensor {self.name} {full} has no head {self.head}", location=checkpoint.file(self.name))
        return full[1:]

    def rows(self, checkpoint: Checkpoint, start: int, stop: int):
        self.shape(checkpoint)
        return checkpoint.read(self.name, self.head, self.head + 1)[0][start:stop]

    def __repr__(self) -> str:
        return f"{self.name}[{self.head}]"


def _interleaved(name: str):
    """in_proj's even rows (x), then its odd rows (z)."""
    def source(arch: Arch, prefix: str):
        d_inner = arch.ssm["d_inner"]
        return View(prefix + name, rows=tuple(range(0, 2 * d_inner, 2)) + tuple(range(1, 2 * d_inner, 2)))
    return source


class ZambaLayout(dict):
    """Fixed names, plus the per-head rows and the interleaved in_proj."""

    HEAD = re.compile(r"(mamba_decoder\.)?ssm\.(" + "|".join(HEAD_PARAMS) + r")\.(\d+)")
    IN_PROJ = re.compile(r"(mamba_decoder\.)?ssm\.in_proj(_bias)?")

    def get(self, key, default=None):
        if not isinstance(key, str):
            return super().get(key, default)
        match = self.HEAD.fullmatch(key)
        if match:
            outer, which, head = match.groups()
            name = f"{'mamba_decoder.' if outer else ''}mamba.{CHECKPOINT_HEAD[which]}"
            return lambda arch, prefix: HeadRow(prefix + name, int(head))
        match = self.IN_PROJ.fullmatch(key)
        if match:
            outer, bias = match.groups()
            return _interleaved(f"{'mamba_decoder.' if outer else ''}mamba.in_proj.{'bias' if bias else 'weight'}")
        return super().get(key, default)


SHARED = "shared_transf."
_MIXER = {"ssm.conv": "conv1d.weight", "ssm.conv_bias": "conv1d.bias", "ssm.out_proj": "out_proj.weight",
          "ssm.out_proj_bias": "out_proj.bias"}
LAYOUTS = {
    "zamba": ZambaLayout({
        "ssm_norm": "input_layernorm.weight", **{k: f"mamba.{v}" for k, v in _MIXER.items()},
        "mamba_decoder.ssm_norm": "mamba_decoder.input_layernorm.weight",
        **{f"mamba_decoder.{k}": f"mamba_decoder.mamba.{v}" for k, v in _MIXER.items()},
        "shared_out": "linear.weight",
        "shared.attn_norm": f"{SHARED}input_layernorm.weight",
        **{f"shared.attn.w{x}": f"{SHARED}self_attn.{x}_proj.weight" for x in "qkvo"},
        "shared.mlp_norm": f"{SHARED}pre_ff_layernorm.weight",
        **{f"shared.mlp.w_{x}": f"{SHARED}feed_forward.{x}_proj.weight" for x in ("gate", "up", "down")},
        "_top": {"embed": "model.embed_tokens.weight", "norm": "model.final_layernorm.weight",
                 "lm_head": "lm_head.weight"}}),
}


@dataclass
class Zamba:
    """What the graph needs beyond ``Arch``."""
    hybrid: list       # the layers with the shared block, in order
    d_ff: int
    gate: str          # the MLP's activation (frontends.dsl_hybrid.GATES)
    heads: int         # n_mamba_heads


def _kinds(cfg: Config) -> list[str]:
    if cfg.raw("layers_block_type") is None:
        n = cfg.get("num_hidden_layers", layer_count)
        period, offset = cfg.get("attn_layer_period", positive_int), cfg.get("attn_layer_offset", non_negative_int)
        return [HYBRID if i % period == offset else MAMBA for i in range(n)]
    kinds = [{"mamba": MAMBA}.get(k, k) for k in cfg.get("layers_block_type", string_list)]
    for kind in kinds:
        if kind not in (MAMBA, HYBRID):
            raise cfg.unsupported("layers_block_type", kind, hint=f"Zamba's layer kinds: {MAMBA}, {HYBRID}")
    try:
        layer_count(len(kinds))
    except Bad as err:
        raise cfg.error("layers_block_type", f"{len(kinds)} layers: {err}") from None
    if cfg.get("num_hidden_layers", positive_int) != len(kinds):
        raise cfg.error("num_hidden_layers", f"{cfg.raw('num_hidden_layers')} layers, but layers_block_type gives "
                                             f"{len(kinds)}", hint="transformers follows the layer list")
    return kinds


def _zamba(cfg: Config, name: str, model_type: str) -> Arch:
    """Zamba: Mamba-1 layers (multi-head), one shared transformer block at the hybrid ones."""
    d = cfg.get("hidden_size", size)
    kinds = _kinds(cfg)
    gate = GATES.get(cfg.raw("hidden_act"))
    if gate is None:
        raise cfg.unsupported("hidden_act", cfg.raw("hidden_act"), hint=f"Zamba's MLP: {', '.join(GATES)}")
    cfg.check("hidden_mamba_act", lambda v: v == "silu", hint="irc's Mamba convolution activation is SiLU")
    cfg.check("attention_hidden_size", lambda v: v is None or v == 2 * d,
              hint=f"the shared block reads concat(x, embeddings): 2 x hidden_size = {2 * d} features")
    heads = cfg.get("num_attention_heads", size)
    kv_heads = cfg.get("num_key_value_heads", size, None) or heads
    if heads % kv_heads:
        raise cfg.error("num_key_value_heads", f"{heads} heads are not divisible by {kv_heads} kv heads")
    head_dim = cfg.get("attention_head_dim", positive_int, None) or 2 * d // heads
    if not head_dim:
        raise cfg.error("num_attention_heads", f"{heads} heads leave 2 x hidden_size {2 * d} no head_dim")
    d_inner = cfg.get("mamba_expand", positive_int) * d
    ssm_heads = cfg.get("n_mamba_heads", positive_int)
    if d_inner % ssm_heads:
        raise cfg.error("n_mamba_heads", f"{ssm_heads} heads do not divide mamba_expand x hidden_size = {d_inner}")
    rank = math.ceil(d / 16) if cfg.raw("mamba_dt_rank") == "auto" else cfg.get("mamba_dt_rank", positive_int)
    ssm = {"kind": "mamba", "d_inner": d_inner, "state_size": cfg.get("mamba_d_state", positive_int),
           "conv_kernel": cfg.get("mamba_d_conv", positive_int), "dt_rank": rank,
           "conv_bias": cfg.get("mamba_conv_bias", boolean), "proj_bias": cfg.get("mamba_proj_bias", boolean)}
    hybrid = [i for i, kind in enumerate(kinds) if kind == HYBRID]
    settings = Zamba(hybrid=hybrid, d_ff=cfg.get("intermediate_size", positive_int), gate=gate, heads=ssm_heads)
    layers = [LayerSpec(None, None, mixer="attention+mamba" if kind == HYBRID else "mamba") for kind in kinds]
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=len(kinds), norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=Attention("gqa", heads, kv_heads, head_dim, scale=(head_dim / 2) ** -0.5), layers=layers,
                mlp={"kind": "swiglu" if gate == "silu" else "geglu", "d_ff": settings.d_ff},
                tied=cfg.get("tie_word_embeddings", boolean), checkpoint="zamba", ssm=ssm,
                expand=partial(_zamba_graph, settings))


def multi_head_mamba(layer, x, heads: int, d_inner: int, state_size: int, conv_kernel: int, dt_rank: int,
                     conv_bias: bool, proj_bias: bool):
    """Zamba's Mamba-1 mixer: in_proj -> x | z; causal conv + SiLU over x; per head h (its
    d_inner / heads channels) x_proj.{h} -> dt | B | C, dt_proj.{h} -> one ``selective_scan``
    over its slice of the state; heads concatenated -> out_proj."""
    m, p, i = layer.model, layer.prefix, layer.index
    d, width = m._features(x), d_inner // heads
    xz = layer._linear(x, "in_proj", 2 * d_inner, proj_bias, "ssm_in")
    hidden, gate = layer._split(xz, [d_inner, d_inner], ["ssm_x", "ssm_z"])
    hidden = layer._conv(hidden, d_inner, conv_kernel, conv_bias)
    past = m._state(i, "recurrent_state", (d_inner, state_size))
    mask, _ = m._context()
    outputs, states = [], []
    for h in range(heads):
        xh, zh, ph = hidden, gate, past
        if heads > 1:
            lo, hi = h * width, (h + 1) * width
            xh = m.emit("slice", [hidden], {"axis": -1, "start": lo, "end": hi}, f"{p}ssm_x.{h}")[0]
            zh = m.emit("slice", [gate], {"axis": -1, "start": lo, "end": hi}, f"{p}ssm_z.{h}")[0]
            ph = m.emit("slice", [past], {"axis": 1, "start": lo, "end": hi}, f"{p}ssm_past.{h}")[0]
        w_x = m.param(f"{p}ssm.x_proj.{h}", (dt_rank + 2 * state_size, width))
        params = m.emit("linear", [xh, w_x, None], None, f"{p}ssm_params.{h}")[0]
        dt, b, c = layer._split(params, [dt_rank, state_size, state_size],
                                [f"ssm_dt_low.{h}", f"ssm_B.{h}", f"ssm_C.{h}"])
        dt = m.emit("linear", [dt, m.param(f"{p}ssm.dt_proj.{h}", (width, dt_rank)),
                               m.param(f"{p}ssm.dt_proj_bias.{h}", (width,))], None, f"{p}ssm_dt.{h}")[0]
        A_log, D = m.param(f"{p}ssm.A_log.{h}", (width, state_size)), m.param(f"{p}ssm.D.{h}", (width,))
        state_name = f"present.{i}.recurrent_state" if heads == 1 else f"{p}ssm_state.{h}"
        y, state = m.emit("selective_scan", [xh, dt, A_log, b, c, D, zh, ph, mask], None,
                          [f"{p}ssm_y.{h}", state_name])
        outputs.append(y)
        states.append(state)
    if heads == 1:
        y, present = outputs[0], states[0]
    else:
        y = m.emit("concat", outputs, {"axis": -1}, f"{p}ssm_y")[0]
        present = m.emit("concat", states, {"axis": 1}, f"present.{i}.recurrent_state")[0]
    m._presents.append(present.value)
    layer._note_ssm("mamba", d_inner=d_inner, state_size=state_size, conv_kernel=conv_kernel, dt_rank=dt_rank)
    return layer._linear(y, "out_proj", d, proj_bias, "ssm_out")


def _shared_block(m: Model, s: Zamba, arch: Arch, owner: str) -> dict:
    d, wide, a = arch.d_model, 2 * arch.d_model, arch.attention
    return {"attn_norm": m.param(f"{owner}attn_norm", (wide,)),
            "wq": m.param(f"{owner}attn.wq", (a.heads * a.head_dim, wide)),
            "wk": m.param(f"{owner}attn.wk", (a.kv_heads * a.head_dim, wide)),
            "wv": m.param(f"{owner}attn.wv", (a.kv_heads * a.head_dim, wide)),
            "wo": m.param(f"{owner}attn.wo", (d, a.heads * a.head_dim)),
            "mlp_norm": m.param(f"{owner}mlp_norm", (d,)),
            "w_gate": m.param(f"{owner}mlp.w_gate", (s.d_ff, d)), "w_up": m.param(f"{owner}mlp.w_up", (s.d_ff, d)),
            "w_down": m.param(f"{owner}mlp.w_down", (d, s.d_ff))}


def _zamba_graph(s: Zamba, arch: Arch, origin: str):
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps, d = arch.attention, arch.norm_eps, arch.d_model
    ssm = {k: v for k, v in arch.ssm.items() if k != "kind"}
    block = None
    with m.at(origin):
        x = m.embed(m.input_ids())
        embeddings = x
        for layer in m.layers(arch.n_layers):
            p = layer.prefix
            if layer.index not in s.hybrid:
                x = x + multi_head_mamba(layer, layer.rms_norm(x, "ssm_norm", eps), s.heads, **ssm)
                continue
            if block is None or not arch.tied:
                block = _shared_block(m, s, arch, f"{p}shared.")
            joined = m.emit("concat", [x, embeddings], {"axis": -1}, f"{p}shared_in")[0]
            h = norm_with(m, joined, block["attn_norm"], eps, f"{p}shared_attn_norm_out")
            h = shared_attention(layer, h, block, a.heads, a.kv_heads, a.head_dim, scale=a.scale)
            h = norm_with(m, h, block["mlp_norm"], eps, f"{p}shared_mlp_norm_out")
            g = m.emit("linear", [h, block["w_gate"], None], None, f"{p}mlp_gate")[0]
            u = m.emit("linear", [h, block["w_up"], None], None, f"{p}mlp_up")[0]
            h = glu(layer, g, u, block["w_down"], gate=s.gate)
            h = m.emit("linear", [h, m.param(f"{p}shared_out", (d, d)), None], None, f"{p}shared_out")[0]
            with scope(layer, "mamba_decoder"):
                y = multi_head_mamba(layer, layer.rms_norm(m.add(x, h, f"{p}mamba_in"), "ssm_norm", eps), s.heads,
                                     **ssm)
            x = x + y
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


FAMILIES = {"zamba": _zamba}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS", "HeadRow", "multi_head_mamba"]
