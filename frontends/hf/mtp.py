"""A checkpoint's multi-token-prediction (MTP) head: a second graph beside the decoder that
drafts the token after next for speculative decoding (``irc run --speculative mtp``).

The computation is transformers 5.25's generic ``MtpModel`` (``modeling_layers.MtpLayer``),
which DeepSeek-V3's paper describes and vLLM's ``deepseek_mtp`` / ``qwen3_next_mtp`` run:

    x = eh_proj(concat(enorm(embed(t_{i+1})), hnorm(h_i)))   [hnorm first where the family says]
    x = one decoder block of the family (its own KV cache; RoPE at t_{i+1}'s position)
    h' = post_norm(x);   logits = lm_head(h')                 (embed and lm_head: the decoder's)

where h_i is the decoder's last hidden state at position i, the head's input after the
final norm (transformers' ``hidden_states[-1]``; the decoder returns it as ``hidden_states``
when compiled with ``--mtp``). Chained, the next draft step feeds h' back as h (transformers'
``MtpModel.forward`` hands each layer's post-normed output to the next; a checkpoint with one
MTP layer runs it again, as vLLM does with ``num_speculative_tokens`` above the layers).

The graph (``graph.parts["mtp"]``): inputs ``input_ids`` (t_{i+1}...), ``attention_mask``,
``position_ids`` (their positions), ``hidden_states`` [B, T, d] (h_i...) and the block's cache
``past_key_values.0.*``; outputs ``logits``, the presents and ``hidden_states_out`` (h').

Where each family's head lives: ``frontends.hf.mtp_forms``. A config that declares a head its
checkpoint lacks (transformers' ``save_pretrained`` drops it) has none: ``irc run
--speculative mtp`` then says so.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from frontends.dsl import ACTIVATION, Model, Tensor
from frontends.hf.build import attach_weights, build_graph
from frontends.hf.config import Arch, Config
from frontends.hf.families import LAYOUTS, TOP_NAMES
from frontends.hf.mtp_forms import FORMS
from irc.errors import SpecError
from irc.graph import Graph

HIDDEN = "hidden_states"  # the decoder's output and the head's input: h_i
NEXT_HIDDEN = "hidden_states_out"  # the head's output: h', the next draft step's h
PART = "mtp"


def read_head(cfg: Config, arch: Arch) -> None:
    """Set ``arch.mtp`` where config.json declares an MTP head of a family ``FORMS`` knows."""
    form = FORMS.get(arch.model_type)
    if form is not None and arch.encoder is None and arch.image_token is None:
        arch.mtp = form(cfg, arch)


def has_head(arch: Arch, checkpoint) -> bool:
    """Whether ``checkpoint`` holds the head ``arch.mtp`` names (its projection, at least)."""
    return arch.mtp.names["mtp.eh_proj"] in checkpoint.files


def head_arch(arch: Arch, layout: Optional[str] = None) -> Arch:
    """The Arch whose expansion is the MTP graph: one layer (the head's block), the head's own
    layout (``head_layout``; ``layout`` where the caller names the tensors itself, as
    ``frontends.gguf.mtp`` does), ``embedded_inputs`` projecting (``MtpHead.draft``)."""
    head = arch.mtp
    return dataclasses.replace(arch, name=f"{arch.name}-{PART}", n_layers=1, layers=[head.spec],
                               checkpoint=layout or head_layout(arch),
                               mtp=dataclasses.replace(head, draft=projected_inputs))


def head_layout(arch: Arch) -> str:
    """The key of the head's checkpoint layout in ``families.LAYOUTS`` (made on first use): the
    family's names for the block under the head's prefix, the head's own params at the top."""
    key = f"{arch.checkpoint}+{PART}:{arch.mtp.prefix}{arch.mtp.index}"
    if key not in LAYOUTS:
        family = LAYOUTS[arch.checkpoint]
        top = {**family.get("_top", TOP_NAMES), **arch.mtp.names}
        layout = {**family, "_prefix": arch.mtp.prefix, "_layer_offset": arch.mtp.index, "_top": top}
        layout.pop("_resolve", None)  # a resolver reads the decoder's own prefix: the head's names are plain
        LAYOUTS[key] = layout
    return key


def projected_inputs(m: Model, arch: Arch) -> Tensor:
    """The head's first hidden state: eh_proj(concat(enorm(embed(ids)), hnorm(hidden)))."""
    head = arch.mtp
    embedded = m.rms_norm(m.embed(m.input_ids(), scale=arch.embedding_scale), "mtp.enorm", arch.norm_eps,
                          arch.norm_offset)
    hidden = Tensor(m, m.graph.add_input(HIDDEN, ACTIVATION, ("B", "T", arch.d_model)))
    hidden = m.rms_norm(hidden, "mtp.hnorm", arch.norm_eps, arch.norm_offset)
    pair = [hidden, embedded] if head.hidden_first else [embedded, hidden]
    joined = m.emit("concat", pair, {"axis": -1}, "mtp.joined")[0]
    weight = m.param("mtp.eh_proj", (arch.d_model, 2 * arch.d_model))
    return m.emit("linear", [joined, weight], None, "mtp.projected")[0]


def return_hidden(graph: Graph, name: str = HIDDEN) -> None:
    """Make the LM head's input (the final norm's output, before any logits scale) an output
    ``name``, after the others; once."""
    if any(v.name == name for v in graph.outputs):
        return
    head = next(n for n in graph.nodes if n.op == "linear" and n.outputs[0].name in ("logits", "logits_uncapped"))
    value = head.inputs[0]
    if value.producer is not None and value.producer.op == "scale":
        value = value.producer.inputs[0]
    graph.rename(value, name)
    graph.outputs.append(value)


def build_head(arch: Arch, cfg: Config, checkpoint=None) -> Graph:
    """The MTP graph of ``arch`` (module docstring), its params pointed at ``checkpoint``."""
    head = head_arch(arch)
    graph = build_graph(head, cfg)
    if not any(v.name == HIDDEN for v in graph.inputs):
        raise SpecError(f"{arch.model_type}: this family's decoder does not build an MTP head", location=cfg.path)
    return_hidden(graph, NEXT_HIDDEN)
    graph.meta["mtp"] = {"layers": arch.mtp.layers, "hidden_first": arch.mtp.hidden_first}
    if checkpoint is not None:
        attach_weights(graph, head, checkpoint, whole=False)
    return graph


def drop_head(graph: Graph) -> None:
    """The decoder alone: no MTP part, no ``hidden_states`` output."""
    graph.parts.pop(PART, None)
    graph.outputs = [v for v in graph.outputs if v.name != HIDDEN]


__all__ = ["HIDDEN", "NEXT_HIDDEN", "PART", "build_head", "drop_head", "has_head", "read_head", "return_hidden"]
