"""The state-space and hybrid families irc reads from config.json (``frontends.hf.families``
dispatches here for these model types):

=================  ==========================================================================
mamba              Mamba-1: every layer x + mixer(norm(x)); selective scan, per-channel A
falcon_mamba       Mamba-1 with weightless RMS norms on dt, B and C (``mixer_rms_eps``)
mamba2             Mamba-2: SSD with n_groups of B and C, dt_bias, ``time_step_limit``,
                   the gated RMS norm grouped by n_groups
jamba ...          the hybrids (Jamba, Bamba, Granite-4.0-H, Nemotron-H):
                   ``frontends.hf.families_hybrid``
=================  ==========================================================================

Sizes follow transformers' config classes: ``intermediate_size`` = expand · hidden_size,
``time_step_rank`` "auto" = ceil(hidden_size / 16); Mamba-2 checks num_heads · head_dim
== expand · hidden_size (as ``validate_architecture`` does). Norms read
``layer_norm_epsilon``. transformers clamps Mamba-2's Δ to ``time_step_limit`` in prefill
but not in its one-token step; irc clamps in both (the same with the default (0, inf)).

Checkpoint names (``LAYOUTS``): Mamba ``backbone.embeddings.weight``,
``backbone.layers.{i}.norm.weight``, ``backbone.layers.{i}.mixer.*``,
``backbone.norm_f.weight``, ``lm_head.weight`` (left out when tied); the hybrids' below.
Tensors a layout cannot name by a string (per-expert tensors stacked into one param, the
gate and up halves of a fused projection) are ``fused_source``'s.
"""
from __future__ import annotations

import re
from typing import Optional

import numpy as np

from frontends.hf import families_hybrid
from frontends.hf.config import (MAMBA2_KEYS, MAMBA_KEYS, Arch, Config, LayerSpec, mamba2_config, mamba_config,
                                 time_step_limit)
from frontends.hf.weights import Checkpoint, Source, Stack, Tensor
from irc.errors import SpecError
from irc.yamlloc import boolean, layer_count, positive_int, positive_number, size

_MAMBA = {"layer_norm_epsilon": 1e-5, "expand": 2, "conv_kernel": 4, "use_bias": False, "use_conv_bias": True,
          "hidden_act": "silu", "time_step_rank": "auto", "tie_word_embeddings": True, "state_size": 16,
          "residual_in_fp32": True}
DEFAULTS = {
    "mamba": dict(_MAMBA),
    "falcon_mamba": {**_MAMBA, "mixer_rms_eps": 1e-6},
    "mamba2": {**_MAMBA, "num_heads": 128, "head_dim": 64, "state_size": 128, "n_groups": 8,
               "time_step_limit": [0.0, float("inf")], "tie_word_embeddings": False},
    **families_hybrid.DEFAULTS,
}


def ssm_names(mixer: str) -> dict:
    """irc's ``ssm.*`` params -> the checkpoint's names under ``{layer}.{mixer}.`` (the
    Mamba mixers of every family name their tensors alike)."""
    return {
        "ssm.in_proj": f"{mixer}.in_proj.weight", "ssm.in_proj_bias": f"{mixer}.in_proj.bias",
        "ssm.conv": f"{mixer}.conv1d.weight", "ssm.conv_bias": f"{mixer}.conv1d.bias",
        "ssm.x_proj": f"{mixer}.x_proj.weight", "ssm.dt_proj": f"{mixer}.dt_proj.weight",
        "ssm.dt_proj_bias": f"{mixer}.dt_proj.bias", "ssm.A_log": f"{mixer}.A_log", "ssm.D": f"{mixer}.D",
        "ssm.dt_bias": f"{mixer}.dt_bias", "ssm.norm": f"{mixer}.norm.weight",
        "ssm.out_proj": f"{mixer}.out_proj.weight", "ssm.out_proj_bias": f"{mixer}.out_proj.bias",
        "ssm.dt_norm": f"{mixer}.dt_layernorm.weight", "ssm.B_norm": f"{mixer}.b_layernorm.weight",
        "ssm.C_norm": f"{mixer}.c_layernorm.weight",
    }


BACKBONE = {"embed": "backbone.embeddings.weight", "norm": "backbone.norm_f.weight", "lm_head": "lm_head.weight"}
FINAL_LAYERNORM = {"embed": "model.embed_tokens.weight", "norm": "model.final_layernorm.weight",
                   "lm_head": "lm_head.weight"}
LAYOUTS = {  # a family layout: layer names, and where it departs from model.layers.{i} / model.*
    "mamba": {"ssm_norm": "norm.weight", **ssm_names("mixer"), "_prefix": "backbone.layers.", "_top": BACKBONE},
    # Jamba and Bamba: input_layernorm before either mixer, pre_ff_layernorm before the feed-forward
    "jamba": {"ssm_norm": "input_layernorm.weight", "mlp_norm": "pre_ff_layernorm.weight", **ssm_names("mamba"),
              **{f"mlp.w_{x}": f"feed_forward.{x}_proj.weight" for x in ("gate", "up", "down")},
              "moe.router": "feed_forward.router.weight", "_top": FINAL_LAYERNORM},
    "granitemoehybrid": {"ssm_norm": "input_layernorm.weight", **ssm_names("mamba"),
                         "moe.router": "block_sparse_moe.router.layer.weight",
                         "moe.w_down": "block_sparse_moe.output_linear.weight",
                         "moe.shared_down": "shared_mlp.output_linear.weight",
                         "mlp.w_down": "shared_mlp.output_linear.weight"},
    # Nemotron-H: one mixer per layer, all under "mixer", each after the layer's one norm
    "nemotron_h": {**{f"{n}_norm": "norm.weight" for n in ("attn", "ssm", "mlp")}, **ssm_names("mixer"),
                   **{f"attn.w{x}": f"mixer.{x}_proj.weight" for x in "qkvo"},
                   "mlp.w_up": "mixer.up_proj.weight", "mlp.w_down": "mixer.down_proj.weight",
                   "mlp.b_up": "mixer.up_proj.bias", "mlp.b_down": "mixer.down_proj.bias",
                   "moe.router": "mixer.gate.weight", "moe.router_bias": "mixer.gate.e_score_correction_bias",
                   **{f"moe.shared_{x}": f"mixer.shared_experts.{x}_proj.weight" for x in ("up", "down")},
                   "_prefix": "backbone.layers.", "_top": BACKBONE},
}


# ---- tensors a layout string cannot name ----------------------------------------------------

class Half(Tensor):
    """The first or second half of a fused gate|up projection's rows, as transformers'
    ``.chunk(2, dim=-1)`` splits its output: rows of a 2-D [2F, d] tensor, or [:, rows] of a
    3-D per-expert [E, 2F, d] one (Granite's ``input_linear``)."""

    def __init__(self, name: str, second: bool):
        super().__init__(name)
        self.second = second

    def _bounds(self, checkpoint: Checkpoint) -> tuple[list[int], int, int]:
        full = checkpoint.info(self.name)[1]
        if len(full) not in (2, 3) or full[-2] % 2:
            raise SpecError(f"tensor {self.name} {full} is not a fused gate|up projection (an even number of rows)",
                            location=checkpoint.file(self.name))
        half = full[-2] // 2
        start = half if self.second else 0
        return full, start, start + half

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        full, start, stop = self._bounds(checkpoint)
        return full[:-2] + [stop - start, full[-1]]

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        full, first, last = self._bounds(checkpoint)
        if len(full) == 2:
            return checkpoint.read(self.name, first + start, first + stop)
        return np.ascontiguousarray(checkpoint.read(self.name, start, stop)[:, first:last])

    def __repr__(self) -> str:
        return f"{self.name}[{'second' if self.second else 'first'} half]"


class Fused:
    """A layout entry for ``fused_source``: ``name`` under the layer, one ``Half`` of it
    (``half`` 0 or 1), or per-expert tensors (``{e}`` in ``name``) stacked into [E, ...]."""

    def __init__(self, name: str, half: Optional[int] = None):
        self.name, self.half = name, half

    def source(self, arch: Arch, prefix: str) -> Source:
        if self.half is not None:
            return Half(prefix + self.name, bool(self.half))
        return Stack([Tensor(prefix + self.name.format(e=e)) for e in range(arch.moe["experts"])])


FUSED = {
    "jamba": {f"moe.w_{x}": Fused(f"feed_forward.experts.{{e}}.{x}_proj.weight") for x in ("gate", "up", "down")},
    "granitemoehybrid": {
        "moe.w_gate": Fused("block_sparse_moe.input_linear.weight", 0),
        "moe.w_up": Fused("block_sparse_moe.input_linear.weight", 1),
        **{f"{kind}_{x}": Fused("shared_mlp.input_linear.weight", half)
           for kind in ("moe.shared", "mlp.w") for x, half in (("gate", 0), ("up", 1))}},
    "nemotron_h": {f"moe.w_{x}": Fused(f"mixer.experts.{{e}}.{x}_proj.weight") for x in ("up", "down")},
    "granitemoe": {"moe.w_gate": Fused("block_sparse_moe.input_linear.weight", 0),
                   "moe.w_up": Fused("block_sparse_moe.input_linear.weight", 1)},  # families_llama_like
}
LAYER_PARAM = re.compile(r"layers\.(\d+)\.(.+)")


def fused_source(arch: Arch, param: str) -> Optional[Source]:
    """The checkpoint tensors behind ``param`` where the family's ``FUSED`` names them; None
    elsewhere (``families.checkpoint_source`` names the rest)."""
    match = LAYER_PARAM.fullmatch(param)
    entry = FUSED.get(arch.checkpoint, {}).get(match.group(2)) if match else None
    if entry is None:
        return None
    return entry.source(arch, f"{LAYOUTS.get(arch.checkpoint, {}).get('_prefix', 'model.layers.')}{match.group(1)}.")


# ---- the pure state-space families --------------------------------------------------------

def _mamba(cfg: Config, name: str, model_type: str) -> Arch:
    """Mamba-1, Falcon-Mamba and Mamba-2: pure state-space decoders."""
    cfg.check("hidden_act", lambda v: v == "silu", hint="the Mamba mixers irc builds use SiLU")
    d, n = cfg.get("hidden_size", size), cfg.get("num_hidden_layers", layer_count)
    eps = cfg.get("layer_norm_epsilon", positive_number)
    if model_type == "mamba2":
        ssm = mamba2_config(cfg, d)
    elif model_type == "falcon_mamba":
        ssm = mamba_config(cfg, d, bcdt_norm="plain", eps=cfg.get("mixer_rms_eps", positive_number, None))
    else:
        ssm = mamba_config(cfg, d)
    layers = [LayerSpec(None, None, mixer=ssm["kind"], ffn=False) for _ in range(n)]
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=eps, attention=None, layers=layers, mlp=None,
                tied=cfg.get("tie_word_embeddings", boolean), checkpoint="mamba", ssm=ssm)


FAMILIES = {"mamba": _mamba, "falcon_mamba": _mamba, "mamba2": _mamba, **families_hybrid.FAMILIES}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS", "fused_source", "ssm_names", "mamba_config", "mamba2_config",
           "time_step_limit", "MAMBA_KEYS", "MAMBA2_KEYS"]
