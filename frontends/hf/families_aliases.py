"""Decoders transformers builds from a family irc already has, under their own config
classes (``frontends.hf.families`` registers them): an alias, or the shared decoder with a
few settings of its own.

=================  ==========================================================================
exaone             EXAONE 3.x: transformers' LlamaForCausalLM (``ExaoneConfig``; RoPE base
                   500000). Keys under the original names as well (``num_layers``,
                   ``layer_norm_epsilon``, ``activation_function``); the checkpoint under
                   EXAONE's names (``transformer.h.{i}.attn.attention.q_proj``, ``ln_1``,
                   ``mlp.c_fc_0`` / ``c_fc_1`` / ``c_proj``, ``transformer.wte``,
                   ``transformer.ln_f``: what save_pretrained writes) or Llama's
internlm3          InternLM3: LlamaForCausalLM, head_dim 128 by default (``qkv_bias`` and
                   ``bias`` are the biases' original names)
iquestcoder        IQuest-Coder: LlamaForCausalLM, head_dim 128 by default
gpt-sw3            GPT-SW3: GPT-2 (``GPT2Config``, ``GPT2LMHeadModel``: ``families_classic``)
sarvam_mla         Sarvam-105B: DeepSeek-V3 (MLA, sigmoid router; defaults one expert group,
                   direct q, one dense layer). The original config's ``num_experts`` /
                   ``num_local_experts`` and ``num_shared_experts`` are ``n_routed_experts``
                   and ``n_shared_experts``; its ``head_dim`` and ``q_head_dim`` are ignored
                   (as transformers does); ``rope_scaling`` of type ``deepseek_yarn`` is YaRN
helium             Helium: Llama with interleaved RoPE (pairs 2i, 2i + 1), q/k/v biases with
                   ``attention_bias`` (never on o_proj), RMS eps 1e-8, RoPE base 100000
seed_oss           Seed-OSS: Llama with q/k/v biases (``attention_bias``, default true),
                   head_dim 128 by default
arcee              Arcee AFM: Llama attention, an ungated squared-ReLU MLP (``up_proj``,
                   ``down_proj``, biases with ``mlp_bias``)
ernie4_5           ERNIE-4.5 (dense): Llama with interleaved RoPE, RoPE base 500000, tied,
                   head_dim 128 by default
cwm                CWM: Llama with a window (``sliding_window``) on the ``layer_types``
                   "sliding_attention" layers (default: all but every 4th, from layer 0);
                   without ``rope_parameters`` / ``rope_scaling`` its config class's llama3
                   RoPE (base 1e6, factor 16, original 8192), top-level ``rope_theta`` unread
=================  ==========================================================================

Keys read under transformers' ``attribute_map`` (``Aliased``): where the file writes the
alias, it wins over the name it maps to, as in transformers.

Attention biases as transformers places them: Llama's ``attention_bias`` on q, k, v and o
(EXAONE, InternLM3, IQuest-Coder, Arcee), Seed-OSS's on q, k, v and ``attention_out_bias`` on o.

Refused, naming config.json and the key: ``mlp_bias`` on a gated MLP, ERNIE's ``use_bias``,
an activation other than the family's, a ``partial_rotary_factor`` (transformers' rotary
embeddings here rotate whole heads), Helium's heads x head_dim other than hidden_size
(transformers' o_proj reads hidden_size features), IQuest-Coder's ``clip_qkv`` and
``use_sliding_window`` (transformers refuses both), two aliases of one key that disagree.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from frontends.hf import families_classic
from frontends.hf import families_base
from frontends.hf.layouts import checkpoint_source
from frontends.hf.config import Arch, Attention, Config, LayerSpec, RopeSpec, read_rope
from frontends.hf.families_common import FULL, SLIDING, _arch, _dims, _layer_types, _no, _rope, _silu, _swiglu, _windows
from irc.yamlloc import boolean, positive_int

_LLAMA = {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
          "mlp_bias": False}
_MLA = {"q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128}
DEFAULTS = {  # transformers 5.25's config classes
    "exaone": {**_LLAMA, "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 14336,
               "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "max_position_embeddings": 4096, "rope_theta": 500000.0},
    "internlm3": {**_LLAMA, "vocab_size": 128512, "hidden_size": 4096, "intermediate_size": 10240,
                  "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 2,
                  "max_position_embeddings": 32768, "head_dim": 128},
    "iquestcoder": {**_LLAMA, "vocab_size": 76800, "hidden_size": 5120, "intermediate_size": 27648,
                    "num_hidden_layers": 80, "num_attention_heads": 40, "num_key_value_heads": 8,
                    "max_position_embeddings": 131072, "head_dim": 128, "use_sliding_window": False},
    "gpt-sw3": dict(families_classic.DEFAULTS["gpt2"]),
    "sarvam_mla": {**_LLAMA, **_MLA, "rms_norm_eps": 1e-6, "vocab_size": 262144, "hidden_size": 4096,
                   "intermediate_size": 16384, "num_hidden_layers": 32, "num_attention_heads": 64,
                   "max_position_embeddings": 4096, "n_routed_experts": 128, "moe_intermediate_size": 2048,
                   "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
                   "rope_interleave": True, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
                   "n_shared_experts": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1},
    "helium": {**_LLAMA, "rms_norm_eps": 1e-8, "vocab_size": 48000, "hidden_size": 2560, "intermediate_size": 7040,
               "num_hidden_layers": 24, "num_attention_heads": 20, "num_key_value_heads": 20, "head_dim": 128,
               "max_position_embeddings": 4096, "rope_theta": 100000.0},
    "seed_oss": {**_LLAMA, "rms_norm_eps": 1e-6, "vocab_size": 155136, "hidden_size": 4096,
                 "intermediate_size": 27648, "num_hidden_layers": 64, "num_attention_heads": 80,
                 "num_key_value_heads": 8, "max_position_embeddings": 524288, "attention_bias": True,
                 "attention_out_bias": False, "head_dim": 128},
    "arcee": {**_LLAMA, "hidden_act": "relu2", "vocab_size": 32000, "hidden_size": 2560, "intermediate_size": 18432,
              "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 4096},
    "ernie4_5": {**_LLAMA, "tie_word_embeddings": True, "vocab_size": 103424, "hidden_size": 1024,
                 "intermediate_size": 3072, "num_hidden_layers": 18, "num_attention_heads": 16,
                 "num_key_value_heads": 2, "max_position_embeddings": 131072, "use_bias": False, "head_dim": 128,
                 "rope_theta": 500000.0},
    "cwm": {**_LLAMA, "vocab_size": 128256, "hidden_size": 6144, "intermediate_size": 21504, "num_hidden_layers": 64,
            "num_attention_heads": 48, "num_key_value_heads": 8, "max_position_embeddings": 131072, "head_dim": 128,
            "sliding_window": 8192},
}
ALIASES = {  # model_type -> {transformers' name: the attribute_map names that set it}
    "exaone": {"num_hidden_layers": ("num_layers",), "rms_norm_eps": ("layer_norm_epsilon",),
               "hidden_act": ("activation_function",)},
    "internlm3": {"attention_bias": ("qkv_bias",), "mlp_bias": ("bias",)},
    "sarvam_mla": {"n_routed_experts": ("num_experts", "num_local_experts"),
                   "n_shared_experts": ("num_shared_experts",)},
}
CWM_ROPE = {"rope_type": "llama3", "rope_theta": 1e6, "factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192}  # CwmConfig's when the file gives no RoPE settings
CWM_FULL_EVERY = 4  # CwmConfig's default layer_types: layer i full iff i % 4 == 0


class Aliased(Config):
    """A config.json read under transformers' ``attribute_map``: a key the file writes under
    an alias is read, and blamed, under the alias, which wins over the name it maps to
    (transformers sets the aliases after the fields). ``data`` replaces the file's keys
    (Sarvam's translated RoPE); errors still point at the file's lines."""

    def __init__(self, cfg: Config, aliases: dict, data: Optional[dict] = None):
        super().__init__(cfg.data if data is None else data, cfg.path, cfg.text, cfg.defaults)
        self.aliases = aliases

    def name(self, key: str) -> str:
        """The key the file gives ``key``'s value under."""
        present = [alias for alias in self.aliases.get(key, ()) if alias in self.data]
        for other in present[1:]:
            if self.data[other] != self.data[present[0]]:
                raise self.error(other, f"{self.data[other]!r} disagrees with {present[0]} "
                                        f"({self.data[present[0]]!r}); transformers reads both as {key}")
        return present[0] if present else key

    def has(self, key: str) -> bool:
        return super().has(self.name(key))

    def raw(self, key: str, default=None):
        return super().raw(self.name(key), default)

    def get(self, key: str, kind, *default):
        return super().get(self.name(key), kind, *default)

    def check(self, key: str, allowed, hint: Optional[str] = None) -> None:
        super().check(self.name(key), allowed, hint)


def _whole_head(cfg: Config, rope: RopeSpec) -> RopeSpec:
    """Refuse a partial rotary factor: these families' rotary embeddings span the head."""
    if rope.rotary_dim is not None:
        params = cfg.data.get("rope_parameters")
        key = ("rope_parameters.partial_rotary_factor" if isinstance(params, dict)
               and "partial_rotary_factor" in params else "partial_rotary_factor")
        raise cfg.error(key, "a partial rotary width is not supported for this model",
                        hint="transformers' rotary embedding here rotates the whole head")
    return rope


def _decoder(cfg: Config, name: str, model_type: str, dims: dict, rope: RopeSpec, mlp: dict,
             qkv_bias: bool = False, windows: Optional[list] = None, checkpoint: str = "llama",
             out_bias: bool = False) -> Arch:
    """The shared decoder: GQA attention (q/k/v biases with ``qkv_bias``, o_proj's with
    ``out_bias``), one RoPE."""
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qkv_bias=qkv_bias,
                          out_bias=out_bias)
    layers = [LayerSpec(window, rope) for window in (windows or [None] * dims["layers"])]
    return _arch(cfg, name, model_type, dims, attention, layers, mlp, checkpoint=checkpoint)


def _llama(cfg: Config, name: str, model_type: str) -> Arch:
    """EXAONE, InternLM3, IQuest-Coder: transformers' LlamaForCausalLM."""
    cfg = Aliased(cfg, ALIASES.get(model_type, {}))
    if model_type == "iquestcoder":  # IQuestCoderConfig raises on both
        cfg.check("clip_qkv", lambda v: v is None, hint="transformers' IQuest-Coder does not clamp q, k and v")
        cfg.check("use_sliding_window", lambda v: not v, hint="transformers' IQuest-Coder has no sliding window")
    dims = _dims(cfg)
    _silu(cfg)
    _no(cfg, "mlp_bias")
    rope = _whole_head(cfg, _rope(cfg, dims["head_dim"]))
    bias = cfg.get("attention_bias", boolean)  # Llama's: on q, k, v and o
    return _decoder(cfg, name, model_type, dims, rope, _swiglu(cfg), qkv_bias=bias, out_bias=bias,
                    checkpoint="exaone" if model_type == "exaone" else "llama")


def _gpt_sw3(cfg: Config, name: str, model_type: str) -> Arch:
    """GPT-SW3: GPT-2 under another model_type."""
    arch = families_classic.FAMILIES["gpt2"](cfg, name, model_type)
    arch.checkpoint = "gpt2"
    return arch


def _sarvam(cfg: Config, name: str, model_type: str) -> Arch:
    """Sarvam-105B: DeepSeek-V3 with SarvamMLAConfig's defaults and translations."""
    data = {k: v for k, v in cfg.data.items() if k not in ("head_dim", "q_head_dim")}  # transformers drops both
    scaling = data.get("rope_scaling")
    if isinstance(scaling, dict) and "deepseek_yarn" in (scaling.get("type"), scaling.get("rope_type")):
        # SarvamMLAConfig: YaRN, in place of any rope_parameters
        data["rope_scaling"] = {**{k: v for k, v in scaling.items() if k != "type"}, "rope_type": "yarn"}
        data.pop("rope_parameters", None)
    arch = families_base.FAMILIES["deepseek_v3"](Aliased(cfg, ALIASES[model_type], data), name, "deepseek_v3")
    arch.model_type = model_type
    return arch


def _helium(cfg: Config, name: str, model_type: str) -> Arch:
    """Helium: interleaved RoPE, q/k/v biases, o_proj from hidden_size features."""
    dims = _dims(cfg)
    _silu(cfg)
    _no(cfg, "mlp_bias")
    if dims["heads"] * dims["head_dim"] != dims["d"]:
        raise cfg.error("head_dim", f"{dims['heads']} heads x head_dim {dims['head_dim']} is not hidden_size "
                                    f"{dims['d']}", hint="transformers' Helium projects the attention output "
                                                         "from hidden_size features (o_proj)")
    rope = _whole_head(cfg, _rope(cfg, dims["head_dim"], convention="interleaved"))
    return _decoder(cfg, name, model_type, dims, rope, _swiglu(cfg), qkv_bias=cfg.get("attention_bias", boolean))


def _seed_oss(cfg: Config, name: str, model_type: str) -> Arch:
    """Seed-OSS: q/k/v biases."""
    dims = _dims(cfg)
    _silu(cfg)
    _no(cfg, "mlp_bias")
    rope = _whole_head(cfg, _rope(cfg, dims["head_dim"]))
    return _decoder(cfg, name, model_type, dims, rope, _swiglu(cfg), qkv_bias=cfg.get("attention_bias", boolean),
                    out_bias=cfg.get("attention_out_bias", boolean))


def _arcee(cfg: Config, name: str, model_type: str) -> Arch:
    """Arcee AFM: Llama attention, squared-ReLU MLP."""
    dims = _dims(cfg)
    cfg.check("hidden_act", lambda v: v == "relu2", hint="Arcee's ungated MLP here: relu2 (squared ReLU)")
    mlp = {"kind": "relu2", "d_ff": cfg.get("intermediate_size", positive_int), "bias": cfg.get("mlp_bias", boolean)}
    rope = _whole_head(cfg, _rope(cfg, dims["head_dim"]))
    bias = cfg.get("attention_bias", boolean)  # Llama's: on q, k, v and o
    return _decoder(cfg, name, model_type, dims, rope, mlp, qkv_bias=bias, out_bias=bias, checkpoint="arcee")


def _ernie(cfg: Config, name: str, model_type: str) -> Arch:
    """ERNIE-4.5 (dense): interleaved RoPE."""
    dims = _dims(cfg)
    _silu(cfg)
    _no(cfg, "use_bias")
    rope = _whole_head(cfg, _rope(cfg, dims["head_dim"], convention="interleaved"))
    return _decoder(cfg, name, model_type, dims, rope, _swiglu(cfg))


def _cwm(cfg: Config, name: str, model_type: str) -> Arch:
    """CWM: windows on the sliding layers, llama3 RoPE by default."""
    dims = _dims(cfg)
    _silu(cfg)
    _no(cfg, "mlp_bias")
    types = _layer_types(cfg, dims["layers"], lambda i: SLIDING if i % CWM_FULL_EVERY else FULL)
    if cfg.has("rope_parameters") or cfg.has("rope_scaling"):
        rope = _rope(cfg, dims["head_dim"])
    else:
        rope = read_rope(cfg, dims["head_dim"], dict(CWM_ROPE), "rope_parameters",
                         original_max=cfg.get("max_position_embeddings", positive_int))
    return _decoder(cfg, name, model_type, dims, _whole_head(cfg, rope), _swiglu(cfg), windows=_windows(cfg, types))


def _exaone_resolve(arch: Arch, param: str, checkpoint):
    """EXAONE's names (``build.attach_weights`` asks; None: the layout's), or Llama's where
    the checkpoint has those instead (transformers renames EXAONE's to Llama's on load)."""
    if all(name in checkpoint.files for name in checkpoint_source(arch, param).names()):
        return None
    llama = checkpoint_source(replace(arch, checkpoint="llama"), param)
    return llama if all(name in checkpoint.files for name in llama.names()) else None


FAMILIES = {"exaone": _llama, "internlm3": _llama, "iquestcoder": _llama, "gpt-sw3": _gpt_sw3, "sarvam_mla": _sarvam,
            "helium": _helium, "seed_oss": _seed_oss, "arcee": _arcee, "ernie4_5": _ernie, "cwm": _cwm}
LAYOUTS = {
    "exaone": {"attn_norm": "ln_1.weight", "mlp_norm": "ln_2.weight",
               **{f"attn.{w}{x}": f"attn.attention.{x}_proj.{n}" for x in "qkv" for w, n in (("w", "weight"),
                                                                                            ("b", "bias"))},
               "attn.wo": "attn.attention.out_proj.weight", "attn.bo": "attn.attention.out_proj.bias", "mlp.w_gate": "mlp.c_fc_0.weight",
               "mlp.w_up": "mlp.c_fc_1.weight", "mlp.w_down": "mlp.c_proj.weight",
               "_prefix": "transformer.h.", "_resolve": _exaone_resolve,
               "_top": {"embed": "transformer.wte.weight", "norm": "transformer.ln_f.weight",
                        "lm_head": "lm_head.weight"}},
    "arcee": {"mlp.b_up": "mlp.up_proj.bias", "mlp.b_down": "mlp.down_proj.bias"},
}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
