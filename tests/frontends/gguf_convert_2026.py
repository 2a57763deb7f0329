"""GGUF twins of exaone4, exaone-moe, glm4moe, ernie4_5, ernie4_5-moe, hunyuan-moe, hunyuan-dense,
dots1, seed_oss, arcee, minimax-m2, exaone, stablelm, nemotron, starcoder, llama4, jais2, dbrx, afmoe
and minicpm3 files, written from a tiny transformers model the way llama.cpp's converter writes them
(``Exaone4Model``, ``ExaoneMoEModel``, ``Glm4MoeModel``, ``Ernie4_5Model``, ``Ernie4_5MoeModel``,
``HunYuanMoEModel``, ``HunYuanModel``, ``Dots1Model``, ``SeedOssModel``, ``ArceeModel``,
``MiniMaxM2Model``, ``ExaoneModel``, ``StableLMModel``, ``NemotronModel``, ``StarCoderModel``,
``Llama4Model``, ``Jais2Model``, ``DbrxModel``, ``AfmoeModel``, ``MiniCPM3Model``), independently of
``frontends.gguf``; and Granite-MoE-Shared's granitemoe file (``write_granitemoe_shared``).

Keys: ``TextModel.set_gguf_parameters``' (``gguf_convert.base_keys``), then each converter's own:
EXAONE-4's ``vocab_size``, ``sliding_window`` and ``sliding_window_pattern`` (one bool a layer, from
``layer_types``); K-EXAONE's (EXAONE-4's, its expert keys, ``block_count`` with the MTP layers,
``nextn_predict_layers``); GLM-4.5's ``block_count`` counting the MTP layers,
``rope.dimension_count`` (head_dim * partial_rotary_factor, default 0.5), the expert keys,
``expert_gating_func`` 2 and ``nextn_predict_layers``; ERNIE-MoE's ``interleave_moe_layer_step``,
``leading_dense_block_count`` (``moe_layer_start_index``) and its shared width
``intermediate_size // num_key_value_heads`` (as the converter computes it); Hunyuan's expert
widths and counts (first entries of the per-layer lists) and its alpha-NTK RoPE folded into
``rope.freq_base`` (base * alpha ^ (D / (D - 2)), scaling ``none``); dots1's (Qwen2-MoE's and
its own) expert keys; Arcee's (Llama's) ``vocab_size`` and ``rope.dimension_count``;
MiniMax-M2's ``expert_feed_forward_length`` and ``rope.dimension_count`` (``rotary_dim``);
EXAONE's and Jais-2's ``rope.dimension_count``; AFMoE's (Llama's, its expert keys,
``expert_weights_norm`` true as the Hub's ``route_norm``, which transformers' config drops,
``sliding_window``); Nemotron's ``vocab_size``, its ``norm_eps`` as ``layer_norm_epsilon``,
``rope.dimension_count`` int(factor * hidden_size) // heads and scaling ``none``; Llama-4's
(Llama's, with ``intermediate_size_mlp`` as ``feed_forward_length``, ``intermediate_size`` as the
experts'); StableLM's, StarCoder's, DBRX's and MiniCPM3's keys alone (no base: StarCoder's
``feed_forward_length`` 4 * n_embd and ``head_count_kv`` 1 whatever the config says; MiniCPM3's
no µP scales and no ``value_length``). ``expert_used_count`` is ``num_experts_per_tok`` where
the config has it (the converter's base).

Tensors: gguf's own HF -> GGUF name table; experts stacked [E, ...] (transformers holds them
fused: ``gate_up_proj`` split in halves); ``e_score_correction_bias`` (AFMoE's ``expert_bias``) as ``exp_probs_b.bias``
(ERNIE's [1, E] kept as stored); Llama 3 RoPE scaling as ``rope_freqs`` (EXAONE's, Arcee's and
Llama-4's ``generate_extra_tensors``); StableLM's per-head q/k norms stacked [H, D]; Nemotron's norm
weights stored as 1 + w; Arcee's Q/K rows and biases permuted as Llama's; DBRX's experts [E·F, d]
viewed [E, F, d] (``w2`` to [E, d, F]); Llama-4's fused experts ([E, d, 2F], [E, F, d]) transposed
and split as ``Llama4Model`` does; GLM-4.5's and K-EXAONE's
MTP blocks (``mtp``: the last layer's tensors under the next block numbers, with the ``nextn.*``
tensors) as the converter writes a released checkpoint's; a tied head left out.
"""
from __future__ import annotations

import gguf
import numpy as np

from gguf_convert import base_keys
from gguf_writer import _quantizable, llama3_rope_freqs, permute, write_file

ARCHS = {"exaone4": "EXAONE4", "glm4moe": "GLM4_MOE", "ernie4_5": "ERNIE4_5", "ernie4_5-moe": "ERNIE4_5_MOE",
         "hunyuan-moe": "HUNYUAN_MOE", "hunyuan-dense": "HUNYUAN_DENSE", "dots1": "DOTS1", "seed_oss": "SEED_OSS",
         "arcee": "ARCEE", "minimax-m2": "MINIMAXM2", "exaone": "EXAONE", "stablelm": "STABLELM",
         "nemotron": "NEMOTRON", "starcoder": "STARCODER", "llama4": "LLAMA4", "exaone-moe": "EXAONE_MOE",
         "jais2": "JAIS2", "dbrx": "DBRX", "afmoe": "AFMOE",
         "minicpm3": "MINICPM3"}
OWN_KEYS = ("stablelm", "starcoder", "dbrx", "minicpm3")  # converters that write their keys alone (no TextModel base)


def _rope_params(hparams: dict) -> dict:
    params = hparams.get("rope_parameters") or {}
    return params.get("full_attention", params)


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _first(value):
    return value[0] if isinstance(value, list) else value


def converter_keys(config, arch: str, mtp: int = 0) -> dict:
    """The keys ``arch``'s converter writes, by full name."""
    hparams = config.to_dict()
    if arch == "hunyuan-moe":  # HunYuanMoEModel reads moe_topk itself (base_keys would want num_experts_per_tok)
        hparams = {k: v for k, v in hparams.items() if k not in ("num_experts", "num_experts_per_tok")}
    if arch == "ernie4_5-moe":
        hparams = {k: v for k, v in hparams.items() if k not in ("num_experts", "num_experts_per_tok")}
    keys = {} if arch in OWN_KEYS else base_keys(hparams)
    keys.update(_own_keys(config, arch, hparams, mtp))
    return {f"{arch}.{key}": value for key, value in keys.items()}


def _own_keys(config, arch: str, hparams: dict, mtp: int) -> dict:
    rope = _rope_params(hparams)
    if arch == "exaone-moe":  # Exaone4Model's keys, then ExaoneMoEModel's
        shared = config.num_shared_experts
        return {**_own_keys(config, "exaone4", hparams, mtp), "block_count": config.num_hidden_layers + mtp,
                "expert_feed_forward_length": config.moe_intermediate_size, "expert_shared_count": shared,
                "expert_shared_feed_forward_length": config.moe_intermediate_size * shared,
                "expert_weights_scale": float(config.routed_scaling_factor),
                "expert_weights_norm": bool(config.norm_topk_prob),
                "leading_dense_block_count": config.first_k_dense_replace, "nextn_predict_layers": mtp,
                "rope.scaling.type": "none"}
    if arch == "exaone4":
        keys = {"vocab_size": config.vocab_size}
        if config.sliding_window is not None:
            keys.update({"attention.sliding_window": config.sliding_window, "attention.sliding_window_pattern":
                         [t == "sliding_attention" for t in config.layer_types]})
        return keys
    if arch == "glm4moe":
        return {"block_count": config.num_hidden_layers + mtp, "nextn_predict_layers": mtp,
                "rope.dimension_count": int(_head_dim(config) * rope.get("partial_rotary_factor", 0.5)),
                "expert_count": config.n_routed_experts, "expert_used_count": config.num_experts_per_tok,
                "expert_feed_forward_length": config.moe_intermediate_size,
                "expert_shared_count": config.n_shared_experts,
                "leading_dense_block_count": config.first_k_dense_replace, "expert_gating_func": 2,
                "expert_weights_scale": float(config.routed_scaling_factor),
                "expert_weights_norm": bool(config.norm_topk_prob)}
    if arch == "ernie4_5-moe":
        keys = {"expert_count": config.moe_num_experts, "expert_used_count": config.moe_k,
                "interleave_moe_layer_step": config.moe_layer_interval,
                "leading_dense_block_count": config.moe_layer_start_index,
                "expert_feed_forward_length": config.moe_intermediate_size,
                "expert_shared_count": config.moe_num_shared_experts}
        if config.moe_num_shared_experts > 0:
            keys["expert_shared_feed_forward_length"] = config.intermediate_size // config.num_key_value_heads
        return keys
    if arch.startswith("hunyuan"):
        keys = {}
        if arch == "hunyuan-moe":
            keys = {"expert_count": config.num_experts, "expert_shared_feed_forward_length": config.intermediate_size,
                    "expert_feed_forward_length": config.intermediate_size, "expert_used_count":
                    _first(config.moe_topk), "expert_shared_count": 1}
        if rope.get("rope_type", rope.get("type")) == "dynamic" and rope.get("alpha"):
            dim = _head_dim(config)
            keys.update({"rope.freq_base": float(rope["rope_theta"] * rope["alpha"] ** (dim / (dim - 2))),
                         "rope.scaling.type": "none", "rope.scaling.factor": 1.0,
                         "rope.scaling.original_context_length": 256 * 1024, "context_length": 256 * 1024})
        return keys
    if arch == "dots1":  # Qwen2MoeModel's, then Dots1Model's
        return {"expert_count": config.n_routed_experts, "expert_used_count": config.num_experts_per_tok,
                "expert_feed_forward_length": config.moe_intermediate_size,
                "leading_dense_block_count": config.first_k_dense_replace,
                "expert_shared_count": config.n_shared_experts,
                "expert_weights_scale": float(config.routed_scaling_factor),
                "expert_weights_norm": bool(config.norm_topk_prob)}
    if arch == "arcee":  # LlamaModel's
        return {"vocab_size": config.vocab_size, "rope.dimension_count": _head_dim(config)}
    if arch == "minicpm3":  # MiniCPM3Model's keys alone (no µP scales, no value_length, no RoPE base)
        keys = {"context_length": config.max_position_embeddings, "embedding_length": config.hidden_size,
                "block_count": config.num_hidden_layers, "feed_forward_length": config.intermediate_size,
                "attention.head_count": config.num_attention_heads,
                "attention.head_count_kv": config.num_key_value_heads,
                "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps), "vocab_size": config.vocab_size,
                "attention.kv_lora_rank": config.kv_lora_rank,
                "attention.key_length": config.qk_nope_head_dim + config.qk_rope_head_dim,
                "rope.dimension_count": config.qk_rope_head_dim}
        if config.q_lora_rank is not None:
            keys["attention.q_lora_rank"] = config.q_lora_rank
        return keys
    if arch == "afmoe":  # LlamaModel's, then AfmoeModel's (route_norm: the Hub's true, which the config drops)
        return {"vocab_size": config.vocab_size, "rope.dimension_count": _head_dim(config),
                "expert_shared_count": config.num_shared_experts,
                "expert_feed_forward_length": config.moe_intermediate_size,
                "leading_dense_block_count": config.num_dense_layers,
                "expert_weights_norm": bool(hparams.get("route_norm", True)),
                "expert_weights_scale": float(config.route_scale), "attention.sliding_window": config.sliding_window}
    if arch == "dbrx":  # DbrxModel's keys alone
        attn, ffn = config.attn_config, config.ffn_config
        return {"block_count": config.n_layers, "context_length": config.max_seq_len,
                "embedding_length": config.d_model, "feed_forward_length": ffn.ffn_hidden_size,
                "attention.head_count": config.n_heads,
                "attention.head_count_kv": attn.kv_n_heads, "rope.freq_base": float(attn.rope_theta),
                "attention.clamp_kqv": float(attn.clip_qkv), "expert_count": ffn.moe_num_experts,
                "expert_used_count": ffn.moe_top_k, "attention.layer_norm_epsilon": 1e-5}
    if arch == "jais2":
        return {"rope.dimension_count": _head_dim(config)}
    if arch == "exaone":
        return {"rope.dimension_count": int(rope.get("partial_rotary_factor", 1.0) * (config.hidden_size //
                                                                                      config.num_attention_heads))}
    if arch == "stablelm":  # StableLMModel's keys, no RoPE base (llama.cpp's default 10000)
        factor = rope.get("partial_rotary_factor", hparams.get("partial_rotary_factor"))
        return {"context_length": config.max_position_embeddings, "embedding_length": config.hidden_size,
                "block_count": config.num_hidden_layers, "feed_forward_length": config.intermediate_size,
                "rope.dimension_count": int(factor * (config.hidden_size // config.num_attention_heads)),
                "attention.head_count": config.num_attention_heads,
                "attention.head_count_kv": config.num_key_value_heads,
                "use_parallel_residual": bool(config.use_parallel_residual),
                "attention.layer_norm_epsilon": float(config.layer_norm_eps)}
    if arch == "nemotron":  # rope.dimension_count as the converter computes it: from hidden_size, not head_dim
        factor = rope.get("partial_rotary_factor", hparams.get("partial_rotary_factor"))
        return {"vocab_size": config.vocab_size, "attention.layer_norm_epsilon": float(config.norm_eps),
                "rope.dimension_count": int(factor * config.hidden_size) // config.num_attention_heads,
                "rope.scaling.type": "none"}
    if arch == "starcoder":  # StarCoderModel's keys: 4 * n_embd wide, one kv head
        return {"context_length": config.n_positions, "embedding_length": config.n_embd,
                "feed_forward_length": 4 * config.n_embd, "block_count": config.n_layer,
                "attention.head_count": config.n_head, "attention.head_count_kv": 1,
                "attention.layer_norm_epsilon": float(config.layer_norm_epsilon)}
    if arch == "llama4":  # Llama4Model: intermediate_size_mlp is the dense width, intermediate_size the experts'
        return {"vocab_size": config.vocab_size, "rope.dimension_count": _head_dim(config),
                "feed_forward_length": config.intermediate_size_mlp,
                "expert_feed_forward_length": config.intermediate_size,
                "interleave_moe_layer_step": config.interleave_moe_layer_step}
    if arch == "minimax-m2":
        return {"expert_feed_forward_length": config.intermediate_size, "rope.dimension_count": config.rotary_dim}
    return {}


def _converted(model, arch: str):
    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[ARCHS[arch]], config.num_hidden_layers + 1)
    state = model.state_dict()
    for key, value in state.items():
        data = value.detach().float().numpy().copy()
        parts = key.split(".")
        block = parts[2] if key.startswith("model.layers.") else None
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if "_layernorm.norms." in key:  # StableLMModel: the per-head q/k norms stacked [H, D]
            if key.endswith(".norms.0.weight"):
                which = "q" if ".q_layernorm." in key else "k"
                heads = config.num_attention_heads if which == "q" else config.num_key_value_heads
                yield f"blk.{block}.attn_{which}_norm.weight", np.stack(
                    [state[key.replace(".norms.0.", f".norms.{h}.")].float().numpy() for h in range(heads)])
            continue
        if arch == "dbrx" and ".ffn.experts.mlp." in key:  # DbrxModel: [E·F, d] viewed [E, F, d], w2 to [E, d, F]
            ffn = config.ffn_config
            data = data.reshape(ffn.moe_num_experts, ffn.ffn_hidden_size, config.d_model)
            part = {"w1": "gate", "v1": "up", "w2": "down"}[key.rsplit(".", 1)[1]]
            yield f"blk.{parts[2]}.ffn_{part}_exps.weight", data.transpose(0, 2, 1) if part == "down" else data
            continue
        if arch == "nemotron" and key.endswith("norm.weight"):  # NemotronModel: LayerNorm1P's 1 + w
            data = data + 1
        if arch == "llama4" and key.endswith(("experts.gate_up_proj", "experts.down_proj")):  # [E, d, 2F], [E, F, d]
            rows = data.transpose(0, 2, 1)
            if key.endswith("down_proj"):
                yield f"blk.{block}.ffn_down_exps.weight", rows
            else:
                half = rows.shape[1] // 2
                yield f"blk.{block}.ffn_gate_exps.weight", rows[:, :half]
                yield f"blk.{block}.ffn_up_exps.weight", rows[:, half:]
            continue
        if key.endswith("experts.gate_up_proj"):
            half = data.shape[1] // 2
            yield f"blk.{block}.ffn_gate_exps.weight", data[:, :half]
            yield f"blk.{block}.ffn_up_exps.weight", data[:, half:]
            continue
        if key.endswith("experts.down_proj"):
            yield f"blk.{block}.ffn_down_exps.weight", data
            continue
        if key.endswith(("e_score_correction_bias", ".expert_bias")):
            yield f"blk.{block}.exp_probs_b.bias", data
            continue
        if arch == "arcee" and key.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")):
            data = permute(data, config.num_attention_heads if ".q_proj." in key else config.num_key_value_heads)
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        assert name is not None, key
        yield name, data


def converted(model, arch: str, mtp: int = 0) -> dict:
    """{GGUF name: float32 array} of ``model`` as the converter writes it (``mtp`` GLM-4.5 MTP
    blocks after the model's: the last layer's tensors renamed, plus random ``nextn.*``)."""
    out = {name: np.ascontiguousarray(data, dtype=np.float32) for name, data in _converted(model, arch)}
    rope = _rope_params(model.config.to_dict())
    if rope.get("rope_type") == "llama3":  # generate_extra_tensors: Llama 3 scaling as per-frequency divisors
        out["rope_freqs.weight"] = llama3_rope_freqs(_head_dim(model.config), rope["rope_theta"], rope)
    last, d = model.config.num_hidden_layers - 1, model.config.hidden_size
    rng = np.random.default_rng(0)
    for extra in range(mtp):
        block = f"blk.{last + 1 + extra}."
        out.update({block + name[len(f"blk.{last}."):]: data for name, data in list(out.items())
                    if name.startswith(f"blk.{last}.")})
        out.update({block + "nextn.eh_proj.weight": rng.standard_normal((d, 2 * d)).astype(np.float32),
                    **{block + f"nextn.{n}.weight": np.ones(d, np.float32)
                       for n in ("enorm", "hnorm", "shared_head_norm")}})
    return out


def write_converted(path, model, arch: str, *, mtp: int = 0, qtype=None) -> str:
    """``model`` as a GGUF file of ``arch`` (``qtype``: ``gguf_writer``'s quantization rule)."""
    if arch == "granitemoe":
        return write_granitemoe_shared(path, model, qtype=qtype)
    keys = converter_keys(model.config, arch, mtp)
    tensors = {name: (gguf.quants.quantize(data, qtype), qtype) if _quantizable(name, data, qtype) else data
               for name, data in converted(model, arch, mtp).items()}
    return write_file(path, arch, keys, tensors)


class _Without:
    """A model whose state dict leaves out the tensors whose names hold ``part``."""

    def __init__(self, model, part: str):
        self.config, self._state = model.config, model.state_dict()
        self.part = part

    def state_dict(self) -> dict:
        return {k: v for k, v in self._state.items() if self.part not in k}


def write_granitemoe_shared(path, model, *, qtype=None) -> str:
    """A Granite-MoE-Shared model as ``GraniteMoeModel`` writes it: ``gguf_writer``'s granitemoe
    file plus ``expert_shared_feed_forward_length`` and the shared MLP, its ``input_linear``
    split into gate (first ``shared_intermediate_size`` rows) and up, ``output_linear`` as down."""
    from gguf_writer import write_model

    state, width = model.state_dict(), model.config.shared_intermediate_size

    def extra(w):
        w.add_uint32("granitemoe.expert_shared_feed_forward_length", width)
        for i in range(model.config.num_hidden_layers):
            fused = state[f"model.layers.{i}.shared_mlp.input_linear.weight"].float().numpy()
            w.add_tensor(f"blk.{i}.ffn_gate_shexp.weight", np.ascontiguousarray(fused[:width]))
            w.add_tensor(f"blk.{i}.ffn_up_shexp.weight", np.ascontiguousarray(fused[width:]))
            w.add_tensor(f"blk.{i}.ffn_down_shexp.weight",
                         state[f"model.layers.{i}.shared_mlp.output_linear.weight"].float().numpy())

    return write_model(path, _Without(model, ".shared_mlp."), "granitemoe", qtype=qtype, extra=extra)
