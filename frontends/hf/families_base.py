"""The families ``frontends.hf.families`` defines itself (its module docstring's table):
Llama, Mistral, Mixtral, Qwen2/3 (and their MoE), DeepSeek-V2/V3, Gemma 2, Gemma 3's text
model and Phi-3, a DEFAULTS / FAMILIES / LAYOUTS table like every family module's. Other
family modules build on these (``FAMILIES["deepseek_v3"]``, ``_gemma3_rope``)."""
from __future__ import annotations

from frontends.hf.config import Arch, Attention, Config, LayerSpec, RopeSpec, int_list, read_rope
from frontends.hf.encoder import bidirectional, symmetric_window
from irc.yamlloc import Bad, boolean, non_negative_int, positive_int, positive_number
from frontends.hf.layouts import Experts, Split
from frontends.hf.families_common import (FULL, SLIDING, _arch, _dims, _every_layer_window, _experts, _layer_types,
                                          _no, _qwen_windows, _rope, _silu, _swiglu, _windows)

# transformers 5.2x config-class defaults for keys a config.json may leave out
_LLAMA = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu", "max_position_embeddings": 2048,
          "attention_bias": False, "mlp_bias": False}
_QWEN = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu", "max_position_embeddings": 32768,
         "sliding_window": 4096, "use_sliding_window": False, "max_window_layers": 28, "attention_bias": False}
_GEMMA = {"rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh",
          "sliding_window": 4096, "query_pre_attn_scalar": 256, "attention_bias": False, "head_dim": 256}
_MLA = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
DEFAULTS = {
    "llama": dict(_LLAMA),
    "mistral": {**_LLAMA, "max_position_embeddings": 131072, "sliding_window": 4096, "num_key_value_heads": 8},
    "mixtral": {**_LLAMA, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "num_key_value_heads": 8,
                "num_local_experts": 8, "num_experts_per_tok": 2, "rope_theta": 1e6},
    "qwen2": {**_QWEN, "num_key_value_heads": 32},
    "qwen3": {**_QWEN, "num_key_value_heads": 32, "head_dim": 128},
    "qwen2_moe": {**_QWEN, "num_key_value_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
                  "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "norm_topk_prob": False,
                  "qkv_bias": True, "decoder_sparse_step": 1, "mlp_only_layers": []},
    "qwen3_moe": {**_QWEN, "num_key_value_heads": 4, "num_experts": 128, "num_experts_per_tok": 8,
                  "moe_intermediate_size": 768, "norm_topk_prob": False, "decoder_sparse_step": 1,
                  "mlp_only_layers": []},
    "deepseek_v2": {**_LLAMA, **_MLA, "n_routed_experts": 64, "moe_intermediate_size": 1407, "norm_topk_prob": False,
                    "topk_method": "greedy", "routed_scaling_factor": 1.0, "first_k_dense_replace": 0,
                    "n_shared_experts": 2, "scoring_func": "softmax", "moe_layer_freq": 1},
    "deepseek_v3": {**_LLAMA, **_MLA, "max_position_embeddings": 4096, "n_routed_experts": 256,
                    "moe_intermediate_size": 2048, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
                    "norm_topk_prob": True, "rope_interleave": True, "routed_scaling_factor": 2.5,
                    "first_k_dense_replace": 3, "n_shared_experts": 1, "scoring_func": "sigmoid",
                    "topk_method": "noaux_tc", "moe_layer_freq": 1},
    "gemma2": {**_GEMMA, "max_position_embeddings": 8192, "attn_logit_softcapping": 50.0,
               "final_logit_softcapping": 30.0, "num_key_value_heads": 4},
    "gemma3_text": {**_GEMMA, "max_position_embeddings": 131072, "num_key_value_heads": 4,
                    "use_bidirectional_attention": False},
    "phi3": {**_LLAMA, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "original_max_position_embeddings": 4096},
}



# ---- the families -----------------------------------------------------------------------

def _llama_like(cfg: Config, name: str, model_type: str) -> Arch:
    """Llama, Mistral, Qwen2/3, Mixtral, Qwen2-MoE, Qwen3-MoE, Phi-3."""
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    qkv_bias = qk_norm = False
    if model_type == "llama":
        _no(cfg, "attention_bias", "mlp_bias")
    elif model_type in ("qwen3", "qwen3_moe"):
        _no(cfg, "attention_bias")
        qk_norm = True
    elif model_type == "qwen2":
        qkv_bias = True
    elif model_type == "qwen2_moe":
        qkv_bias = cfg.get("qkv_bias", boolean)

    if model_type in ("mistral", "mixtral", "phi3"):
        windows = _every_layer_window(cfg, n)
    elif model_type in ("qwen2", "qwen3"):
        max_window = cfg.get("max_window_layers", non_negative_int)
        windows = _qwen_windows(cfg, n, lambda i: SLIDING if i >= max_window else FULL)
    elif model_type == "qwen2_moe":
        max_window = cfg.get("max_window_layers", non_negative_int)
        windows = _qwen_windows(cfg, n, lambda i: SLIDING if (i + 1) % 2 and i < max_window else FULL)
    elif model_type == "qwen3_moe":
        windows = _qwen_windows(cfg, n, lambda i: SLIDING)
    else:
        windows = [None] * n

    rope = _rope(cfg, dims["head_dim"])
    moe, moe_layers, mlp = None, [False] * n, _swiglu(cfg)
    if model_type == "mixtral":
        moe = {"experts": _experts(cfg, "num_local_experts", "num_experts"),
               "top_k": cfg.get("num_experts_per_tok", positive_int),
               "d_ff": cfg.get("intermediate_size", positive_int)}
        moe_layers, mlp = [True] * n, None
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        experts = _experts(cfg, "num_experts", "num_local_experts")
        moe = {"experts": experts, "top_k": cfg.get("num_experts_per_tok", positive_int),
               "d_ff": cfg.get("moe_intermediate_size", positive_int),
               "norm_topk_prob": cfg.get("norm_topk_prob", boolean)}
        if model_type == "qwen2_moe":
            moe.update(shared_experts=1, shared_d_ff=cfg.get("shared_expert_intermediate_size", positive_int),
                       shared_expert_gate=True)
        step = cfg.get("decoder_sparse_step", positive_int)
        dense = set(cfg.get("mlp_only_layers", int_list, []))
        moe_layers = [i not in dense and (i + 1) % step == 0 for i in range(n)]
        mlp = _swiglu(cfg) if not all(moe_layers) else None
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qkv_bias=qkv_bias,
                          qk_norm=qk_norm)
    layers = [LayerSpec(window, rope, is_moe) for window, is_moe in zip(windows, moe_layers)]
    checkpoint = {"mixtral": "mixtral", "qwen2_moe": "qwen2_moe", "phi3": "phi3"}.get(model_type, "llama")
    return _arch(cfg, name, model_type, dims, attention, layers, mlp, moe=moe, checkpoint=checkpoint)


def _deepseek(cfg: Config, name: str, model_type: str) -> Arch:
    """DeepSeek-V2 and -V3: MLA attention, dense first layers, routed + shared experts."""
    v3 = model_type == "deepseek_v3"
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    _no(cfg, "attention_bias", "mlp_bias")
    mla = {"q_lora_rank": cfg.get("q_lora_rank", positive_int, None),
           "kv_lora_rank": cfg.get("kv_lora_rank", positive_int),
           "qk_nope_head_dim": cfg.get("qk_nope_head_dim", positive_int),
           "qk_rope_head_dim": cfg.get("qk_rope_head_dim", positive_int),
           "v_head_dim": cfg.get("v_head_dim", positive_int)}
    interleaved = cfg.get("rope_interleave", boolean) if v3 else True
    rope = _rope(cfg, mla["qk_rope_head_dim"], convention="interleaved" if interleaved else "half")
    if rope.rotary_dim is not None:
        raise cfg.unsupported("partial_rotary_factor", cfg.raw("partial_rotary_factor"),
                              hint="MLA rotates exactly qk_rope_head_dim")
    attention = Attention("mla", dims["heads"], dims["heads"], mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"],
                          mla=mla)
    experts = cfg.get("n_routed_experts", positive_int, None)
    moe, moe_layers = None, [False] * n
    if experts is not None:
        cfg.check("moe_layer_freq", lambda v: v == 1,
                  hint="transformers ignores moe_layer_freq, DeepSeek's code does not; irc refuses to guess")
        first_dense = cfg.get("first_k_dense_replace", non_negative_int)
        moe_layers = [i >= first_dense for i in range(n)]
        top_k = cfg.get("num_experts_per_tok", positive_int)
        moe = {"experts": experts, "top_k": top_k, "d_ff": cfg.get("moe_intermediate_size", positive_int),
               "shared_experts": cfg.get("n_shared_experts", non_negative_int, 0) or 0,
               "routed_scale": cfg.get("routed_scaling_factor", positive_number)}
        if v3:
            cfg.check("scoring_func", lambda v: v == "sigmoid", hint="DeepSeek-V3 routes on sigmoid scores")
            cfg.check("topk_method", lambda v: v == "noaux_tc", hint="DeepSeek-V3 selects with noaux_tc")
            moe.update(scoring="sigmoid", router_bias=True, norm_topk_prob=cfg.get("norm_topk_prob", boolean))
            groups = cfg.get("n_group", positive_int, None)
            if groups is not None:
                moe.update(groups=groups, top_groups=cfg.get("topk_group", positive_int), group_score="top2_sum")
        else:
            cfg.check("scoring_func", lambda v: v == "softmax", hint="DeepSeek-V2 routes on softmax scores")
            cfg.check("topk_method", lambda v: v in ("greedy", "group_limited_greedy"),
                      hint="DeepSeek-V2 top-k methods: greedy, group_limited_greedy")
            if cfg.get("norm_topk_prob", boolean) and top_k > 1:
                raise cfg.unsupported("norm_topk_prob", True, hint="transformers' DeepSeek-V2 ignores it and "
                                      "DeepSeek's code applies it; irc refuses to guess")
            moe["norm_topk_prob"] = False
            if cfg.raw("topk_method") == "group_limited_greedy":
                moe.update(groups=cfg.get("n_group", positive_int), top_groups=cfg.get("topk_group", positive_int),
                           group_score="max")
    mlp = _swiglu(cfg) if not all(moe_layers) else None
    layers = [LayerSpec(None, rope, is_moe) for is_moe in moe_layers]
    return _arch(cfg, name, model_type, dims, attention, layers, mlp, moe=moe, checkpoint="deepseek")


def _gemma(cfg: Config, name: str, model_type: str) -> Arch:
    """Gemma 2 and Gemma 3 (text)."""
    gemma3 = model_type == "gemma3_text"
    dims = _dims(cfg)
    n = dims["layers"]
    _no(cfg, "attention_bias")
    activation = cfg.raw("hidden_activation")
    approximate = {"gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu": "none"}.get(activation)
    if approximate is None:
        raise cfg.unsupported("hidden_activation", activation, hint="Gemma's MLP is GeGLU: gelu_pytorch_tanh or gelu")
    encoder = bidirectional(cfg) if gemma3 else None  # EmbeddingGemma: frontends.hf.encoder
    if not gemma3:
        cfg.check("use_bidirectional_attention", lambda v: not v, hint="transformers' Gemma 2 keeps a causal mask "
                  "but tells sdpa is_causal=False: the answer depends on the attention kernel; irc refuses to guess")
    if gemma3:
        pattern = cfg.data.get("sliding_window_pattern", cfg.data.get("_sliding_window_pattern", 6))
        try:
            pattern = positive_int(pattern)
        except Bad as err:
            raise cfg.error("sliding_window_pattern", str(err)) from None
        types = _layer_types(cfg, n, lambda i: SLIDING if (i + 1) % pattern else FULL)
        local = _gemma3_rope(cfg, dims["head_dim"], SLIDING)
        global_ = _gemma3_rope(cfg, dims["head_dim"], FULL)
        ropes = [local if kind == SLIDING else global_ for kind in types]
    else:
        types = _layer_types(cfg, n, lambda i: SLIDING if (i + 1) % 2 else FULL)
        ropes = [_rope(cfg, dims["head_dim"])] * n
    # transformers 5.24's Gemma3Attention never hands attn_logit_softcapping to its attention
    softcap = None if gemma3 else cfg.get("attn_logit_softcapping", positive_number, None)
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qk_norm=gemma3, softcap=softcap,
                          scale=cfg.get("query_pre_attn_scalar", positive_number) ** -0.5)
    windows = [symmetric_window(w) for w in _windows(cfg, types)] if encoder else _windows(cfg, types)
    layers = [LayerSpec(window, rope) for window, rope in zip(windows, ropes)]
    mlp = {"kind": "geglu", "d_ff": cfg.get("intermediate_size", positive_int), "approximate": approximate}
    return _arch(cfg, name, model_type, dims, attention, layers, mlp, norm_offset=1.0, sandwich=True,
                 final_softcap=cfg.get("final_logit_softcapping", positive_number, None),
                 embedding_scale=dims["d"] ** 0.5, checkpoint="gemma", encoder=encoder)


def _gemma3_rope(cfg: Config, head_dim: int, layer_type: str) -> RopeSpec:
    """Gemma 3: local layers default to base 10000 (``rope_local_base_freq`` in older
    configs, unscaled), global layers to 1e6 with ``rope_scaling``."""
    params = cfg.data.get("rope_parameters")
    if isinstance(params, dict) and any(isinstance(v, dict) for v in params.values()):
        if not isinstance(params.get(layer_type), dict):
            raise cfg.error(f"rope_parameters.{layer_type}", "missing: Gemma 3 gives RoPE per layer type")
        return _rope(cfg, head_dim, layer_type, default_base=1e4 if layer_type == SLIDING else 1e6)
    if layer_type == SLIDING:
        base = cfg.get("rope_local_base_freq", positive_number, 1e4)
        return read_rope(cfg, head_dim, {"rope_theta": base}, "rope_local_base_freq")
    return _rope(cfg, head_dim, default_base=1e6)


FAMILIES = {
    "llama": _llama_like, "mistral": _llama_like, "mixtral": _llama_like, "qwen2": _llama_like,
    "qwen3": _llama_like, "qwen2_moe": _llama_like, "qwen3_moe": _llama_like, "phi3": _llama_like,
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek, "gemma2": _gemma, "gemma3_text": _gemma,
}



def _q_rows(arch: Arch) -> tuple[int, int]:
    a = arch.attention
    return 0, a.heads * a.head_dim


def _k_rows(arch: Arch) -> tuple[int, int]:
    a = arch.attention
    return a.heads * a.head_dim, (a.heads + a.kv_heads) * a.head_dim


def _v_rows(arch: Arch) -> tuple[int, int]:
    a = arch.attention
    return (a.heads + a.kv_heads) * a.head_dim, (a.heads + 2 * a.kv_heads) * a.head_dim


def _gate_rows(arch: Arch) -> tuple[int, int]:
    return 0, arch.mlp["d_ff"]


def _up_rows(arch: Arch) -> tuple[int, int]:
    return arch.mlp["d_ff"], 2 * arch.mlp["d_ff"]



LAYOUTS = {  # the families' departures from LAYER_NAMES
    "llama": {},
    "deepseek": {},
    "gemma": {"mlp_norm": "pre_feedforward_layernorm.weight", "post_attn_norm": "post_attention_layernorm.weight",
              "post_mlp_norm": "post_feedforward_layernorm.weight"},
    "mixtral": {"moe.router": "block_sparse_moe.gate.weight",
                **{f"moe.w_{x}": Experts(f"block_sparse_moe.experts.{{e}}.{w}.weight")
                   for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))}},
    "qwen2_moe": {**{f"moe.shared_{x}": f"mlp.shared_expert.{x}_proj.weight" for x in ("gate", "up", "down")},
                  "moe.shared_expert_gate": "mlp.shared_expert_gate.weight"},
    "phi3": {"attn.wq": Split("self_attn.qkv_proj.weight", _q_rows),
             "attn.wk": Split("self_attn.qkv_proj.weight", _k_rows),
             "attn.wv": Split("self_attn.qkv_proj.weight", _v_rows),
             "mlp.w_gate": Split("mlp.gate_up_proj.weight", _gate_rows),
             "mlp.w_up": Split("mlp.gate_up_proj.weight", _up_rows)},
}
