"""An ``Arch`` expanded through the DSL, then its params pointed at the checkpoint.

The decoder is the one every family shares (``frontends.yaml_spec`` builds the same):

    x = embed(ids) [* embedding_scale]   [image features merged in: a VLM's, ``Arch.image_token``]
    per layer:  h = attn_norm(x); a = attention(h) [-> post_attn_norm]; x = x + a [* residual_scale]
                  (a state-space mixer instead: h = ssm_norm(x); a = mamba/mamba2(h);
                   no mixer where the layer is only a feed-forward block: Nemotron-H)
                h = mlp_norm(x);  f = mlp or moe(h) [-> post_mlp_norm];   x = x + f [* residual_scale]
                  (left out where the layer has no feed-forward block: Mamba)
    logits = lm_head(norm(x)) [* logits_scale] [softcapped]
      (an encoder, ``Arch.encoder``: last_hidden_state = norm(x), then sentence-transformers'
       Pooling / Dense / Normalize: ``frontends.hf.encoder``)

What each layer holds is its ``LayerSpec`` (``mixer``, ``ffn``, ``moe``, ``rope``, ``window``);
the multipliers are the ``Arch``'s.

Every node's origin is config.json, and a DSL refusal (a top_k above the expert count, an
odd rotary width, ...) is re-raised naming the config.json key behind the argument.
"""
from __future__ import annotations

from frontends.dsl import ArgError, Model
from frontends.hf.config import Arch, Config, dsl_rope
from frontends.hf.encoder import build_outputs
from frontends.hf.families import DSL_ARGS, LAYOUTS, checkpoint_source, is_spare
from frontends.hf.families_common import MLA_NORM_EPS, embedded_inputs
from frontends.hf.weights import Checkpoint, CheckpointData
from irc.errors import SpecError
from irc.graph import Graph


def build_graph(arch: Arch, cfg: Config) -> Graph:
    """The graph of ``arch`` with every param absent."""
    try:
        return expand(arch, cfg.path)
    except ArgError as err:
        key = DSL_ARGS.get(err.arg, err.arg)
        if key == "num_experts" and not cfg.has(key):
            key = next((k for k in ("num_local_experts", "n_routed_experts") if cfg.has(k)), key)
        raise SpecError(f"{key}: {err.detail}", location=cfg.where(key), hint=err.hint) from None


def expand(arch: Arch, origin: str) -> Graph:
    """The decoder of ``arch`` through the DSL, every node's origin ``origin``; a DSL refusal
    propagates as ``ArgError`` (``build_graph`` names the config.json key behind it)."""
    if arch.expand is not None:
        return arch.expand(arch, origin)
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype,
              encoder=arch.encoder is not None)
    eps, offset = arch.norm_eps, arch.norm_offset
    with m.at(origin):
        x = embedded_inputs(m, arch)
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            if spec.mixer == "attention":
                h = layer.rms_norm(x, "attn_norm", eps, offset)
                a = _attention(arch, layer, spec, h)
                if arch.sandwich:
                    a = layer.rms_norm(a, "post_attn_norm", eps, offset)
                x = x + _residual(arch, a)
            elif spec.mixer is not None:
                x = x + _residual(arch, _ssm(arch, layer, spec, layer.rms_norm(x, "ssm_norm", eps, offset)))
            if spec.ffn:
                h = layer.rms_norm(x, "mlp_norm", eps, offset)
                h = layer.moe(h, **arch.moe) if spec.moe else _mlp(arch, layer, h)
                if arch.sandwich:
                    h = layer.rms_norm(h, "post_mlp_norm", eps, offset)
                x = x + _residual(arch, h)
            x = m.deepstack_add(x, layer.index)  # a Qwen3-VL's image features at its first layers
        if arch.encoder is not None:  # an embedding model: frontends.hf.encoder
            build_outputs(m, arch.encoder, m.rms_norm(x, "norm", eps, offset))
            return m.graph
        m.logits(m.rms_norm(x, "norm", eps, offset), tied=arch.tied, softcap=arch.final_softcap,
                 scale=arch.logits_scale)
    return m.graph


def _attention(arch: Arch, layer, spec, h):
    a = arch.attention
    rope = dsl_rope(spec.rope)
    if a.kind == "mla":
        return layer.mla_attention(h, a.heads, rope=rope, eps=MLA_NORM_EPS, scale=a.scale, **a.mla)
    return layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=rope, window=spec.window,
                           softcap=a.softcap, scale=a.scale, qkv_bias=a.qkv_bias, qk_norm=a.qk_norm,
                           qk_norm_eps=arch.norm_eps, qk_norm_offset=arch.norm_offset, out_bias=a.out_bias,
                           query_scale=a.query_scale, causal=arch.encoder is None or arch.encoder.causal,
                           alibi=a.alibi, clip_qkv=a.clip_qkv)


def _ssm(arch: Arch, layer, spec, h):
    config = {k: v for k, v in arch.ssm.items() if k != "kind"}
    if spec.mixer != arch.ssm["kind"]:
        raise ArgError("layer", f"layer {layer.index} is {spec.mixer}, the model's state-space layers are "
                                f"{arch.ssm['kind']}")
    return getattr(layer, spec.mixer)(h, **config)  # the DSL method of that name: mamba, mamba2, ...


def _residual(arch: Arch, branch):
    """A branch as it joins the residual stream: times ``residual_scale`` where there is one."""
    return branch if arch.residual_scale is None else branch * arch.residual_scale


def _mlp(arch: Arch, layer, h):
    mlp = arch.mlp
    if mlp["kind"] == "geglu":
        return layer.geglu(h, d_ff=mlp["d_ff"], approximate=mlp["approximate"])
    if mlp["kind"] == "relu2":
        return layer.relu2_mlp(h, d_ff=mlp["d_ff"], bias=mlp["bias"])
    return layer.swiglu(h, d_ff=mlp["d_ff"])


def attach_weights(graph: Graph, arch: Arch, checkpoint: Checkpoint, whole: bool = True) -> None:
    """Point every param at its checkpoint tensor(s), checking names, shapes and dtypes
    against the headers; tensors left over (other than ``is_spare`` ones) are an error,
    since they mean the checkpoint has parts the built model lacks. A layout whose
    ``_resolve(arch, param, checkpoint)`` is set picks, per param, among the names
    transformers would load (Kimi-Linear's two layouts); where it returns None, and for
    every other layout, ``checkpoint_source`` names the tensor. A graph of part of the
    checkpoint (an MTP head's: ``whole`` false) leaves the rest unchecked."""
    used: set[str] = set()
    resolve = LAYOUTS[arch.checkpoint].get("_resolve")
    for param in graph.params.values():
        if param.data is not None:  # set from another file already (a sentence-transformers Dense)
            continue
        source = resolve(arch, param.name, checkpoint) if resolve else None
        source = source or checkpoint_source(arch, param.name)
        for name in source.names():
            checkpoint.file(name)  # a missing tensor is an error naming it
            checkpoint.dtype(name, integer=not param.dtype.is_float)
        shape = source.shape(checkpoint)
        if tuple(shape) != param.shape:
            raise SpecError(f"tensor {source!r} has shape {shape}; config.json describes @{param.name} as "
                            f"{list(param.shape)}", location=checkpoint.file(source.names()[0]))
        param.data = CheckpointData(checkpoint, source, param.dtype)
        used.update(source.names())
    spare = sorted(name for name in checkpoint.files if whole and name not in used and not is_spare(arch, name))
    if spare:
        more = f" and {len(spare) - 1} more" if len(spare) > 1 else ""
        raise SpecError(f"checkpoint tensor {spare[0]}{more} has no place in the model config.json describes",
                        location=checkpoint.file(spare[0]),
                        hint="the checkpoint has weights irc's model lacks (a bias, another layout?)")
