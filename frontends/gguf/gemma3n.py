"""llama.cpp's ``gemma3n`` (Gemma-3n's text model): its keys -> the ``Arch``
``frontends.hf.families_gemma3n`` builds from a config.json (``frontends.dsl_gemma3n``'s
decoder), its tensors -> the same irc params.

Keys (``Gemma3NModel.set_gguf_parameters``): ``altup.num_inputs`` streams, ``altup.active_idx``,
``embedding_length_per_layer_input`` (the per-layer input width),
``attention.shared_kv_layers`` (the last that many layers reuse the K/V of the last earlier
layer of their type, as transformers chooses), ``activation_sparsity_scale`` (per layer the
multiplier icdf(p), as the converter computed it in float32, which is what transformers
uses; -inf, from p = 0, is a dense MLP; absent: every MLP dense),
``attention.sliding_window_pattern`` (true: a sliding layer; absent: every fifth layer
global), ``feed_forward_length`` (one width, or one per layer). Sliding layers rotate with
``rope.freq_base_swa`` (default 1e4) unscaled, global ones with ``rope.freq_base`` (default
1e6) and the file's scaling. As transformers and llama.cpp compute Gemma-3n: plain norm
weights (the converter shifts none), q and k RMS-normed per head and v without a weight,
attention unscaled (1.0), sandwich norms, sqrt(d) embedding scale, GeGLU (tanh), the
``final_logit_softcapping`` of the file.

Read from tensor shapes: LAuReL's rank (``blk.0.laurel_l``), the per-layer table's rows
(``per_layer_token_embd``). What the converter did, undone on load: ``altup_projections.{j}``
and ``altup_unembed_projections.{j}`` stacked into ``altup_proj`` / ``altup_unembd_proj``
[n - 1, d, d] (each param one slab, ``Slab``).

What the file cannot say, so irc reads what llama.cpp runs: ``altup_correct_scale`` (the
converter writes no flag; the corrected stream is scaled by ``altup_correct_scale`` where a
block has that tensor, as released checkpoints, whose flag is true, have it); and
``vocab_size_per_layer_input``: the converter pads the per-layer table with zero rows to the
vocabulary, so an id past the checkpoint's table reads zeros (llama.cpp's result), where
transformers reads row 0 of the table. A file's K/V projections and norms of the shared
layers, where it has them, are read by no param (as transformers leaves them).

Refused, naming the key: an active stream outside the streams, a per-layer list of the wrong
length, ``shared_kv_layers`` leaving a shared layer without an earlier layer of its type.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Optional

import numpy as np

from frontends.dsl_gemma3n import Gemma3nSpec, gemma3n_graph
from frontends.gguf.arch import Hparams, make_arch, read_dims, read_rope, window_layers
from frontends.gguf.reader import GGUFFile
from frontends.gguf.tensors import TensorSource
from frontends.hf.config import Arch, Attention, LayerSpec
from irc.errors import SpecError


def _per_layer(hp: Hparams, key: str, n: int, default=None) -> Optional[list]:
    """A per-layer array key (or one value for every layer) as a list of ``n``."""
    full = hp.key(key)
    if not hp.gguf.has(full):
        if default is None:
            raise hp.error(key, "missing required key")
        return default
    if not hp.gguf.is_array(full):
        return [hp.gguf.get(full, float)] * n
    values = hp.gguf.get(full, list)
    if len(values) != n:
        raise hp.error(key, f"has {len(values)} entries for {n} layers (block_count)")
    return values


def _tensor_rows(hp: Hparams, name: str) -> int:
    if name not in hp.gguf.tensors:
        raise hp.gguf.error(name, "tensor is missing: the model reads its size from it")
    return int(hp.gguf.tensors[name].shape[0])


def kv_sources(hp: Hparams, local: list[bool]) -> list[Optional[int]]:
    """Per layer the earlier layer whose K/V it reuses (None: its own): each of the last
    ``attention.shared_kv_layers`` layers takes the last earlier layer of its own type."""
    n = len(local)
    shared = hp.count("attention.shared_kv_layers", 0, minimum=0)
    if shared and shared >= n:
        raise hp.error("attention.shared_kv_layers", f"{shared} shared layers of {n}: no layer computes the keys "
                                                     "and values they would share")
    first = n - shared
    sources: list[Optional[int]] = [None] * first
    for i in range(first, n):
        producers = [j for j in range(first) if local[j] == local[i]]
        if not producers:
            kind = "sliding" if local[i] else "global"
            raise hp.error("attention.shared_kv_layers", f"layer {i} ({kind}) shares the keys and values of an "
                                                         f"earlier {kind} layer, and the first {first} layers have "
                                                         "none")
        sources.append(producers[-1])
    return sources


def describe_gemma3n(hp: Hparams, name: str) -> Arch:
    dims = read_dims(hp)
    n, d, head_dim = dims["layers"], dims["d"], dims["head_dim"]
    local = window_layers(hp, n, 5)
    window = hp.count("attention.sliding_window")
    global_rope = read_rope(hp, head_dim, base=hp.number("rope.freq_base", 1e6))
    local_rope = read_rope(hp, head_dim, base=hp.number("rope.freq_base_swa", 1e4), scaled=False)
    streams = hp.count("altup.num_inputs")
    active = hp.count("altup.active_idx", minimum=0)
    if active >= streams:
        raise hp.error("altup.active_idx", f"{active} is not one of the {streams} streams (altup.num_inputs)")
    d_ff = [int(v) for v in _per_layer(hp, "feed_forward_length", n)]
    if any(v < 1 for v in d_ff):
        raise hp.error("feed_forward_length", f"widths {d_ff} are not all positive")
    scales = _per_layer(hp, "activation_sparsity_scale", n, default=[-math.inf] * n)
    sparsity = [None if float(v) == -math.inf else float(v) for v in scales]
    if any(v is not None and not math.isfinite(v) for v in sparsity):
        raise hp.error("activation_sparsity_scale", f"{scales} has a value that is neither finite nor -inf")
    scaled = "blk.0.altup_correct_scale.weight" in hp.gguf.tensors
    spec = Gemma3nSpec(streams=streams, active=active, correct_scale=scaled,
                       laurel_rank=_tensor_rows(hp, "blk.0.laurel_l.weight"),
                       per_layer_dim=hp.count("embedding_length_per_layer_input"),
                       per_layer_vocab=_tensor_rows(hp, "per_layer_token_embd.weight"), d_ff=d_ff, sparsity=sparsity,
                       kv_source=kv_sources(hp, local), approximate="tanh")
    layers = [LayerSpec(window if is_local else None, local_rope if is_local else global_rope) for is_local in local]
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], head_dim, qk_norm=True, scale=1.0)
    return make_arch(hp, name, "gemma3n_text", dims, attention, layers,
                     {"kind": "geglu", "d_ff": d_ff[0], "approximate": "tanh"}, sandwich=True,
                     final_softcap=hp.number("final_logit_softcapping", None), embedding_scale=d ** 0.5,
                     expand=partial(gemma3n_graph, spec))


# ---- tensors -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Slab:
    """Slab ``index`` [d, d] of a stacked [n, d, d] tensor (``altup_proj``, ``altup_unembd_proj``),
    in float."""

    name: str
    index: int

    def names(self) -> list[str]:
        return [self.name]

    def logical_shape(self, gguf: GGUFFile) -> tuple:
        shape = tuple(gguf.tensor(self.name).shape)
        if len(shape) != 3 or self.index >= shape[0]:
            raise SpecError(f"tensor {self.name} {list(shape)} has no slab {self.index} of a stack [n, d, d]",
                            location=gguf.path)
        return shape[1:]

    def exact(self, gguf: GGUFFile) -> bool:
        return False

    def read_float(self, gguf: GGUFFile) -> np.ndarray:
        return np.ascontiguousarray(TensorSource(self.name).read_float(gguf)[self.index])

    def __repr__(self) -> str:
        return f"{self.name}[{self.index}]"


TOP = {"embed_per_layer": "per_layer_token_embd.weight", "per_layer_projection": "per_layer_model_proj.weight",
       "per_layer_projection_norm": "per_layer_proj_norm.weight"}
STACKS = {"altup_projections": "altup_proj.weight", "altup_unembed_projections": "altup_unembd_proj.weight"}
LAYER = {  # irc name under layers.{i}. -> GGUF name under blk.{i}.
    "altup.router_norm": "altup_router_norm.weight", "altup.modality_router": "altup_router.weight",
    "altup.prediction_coefs": "altup_predict_coef.weight", "altup.correction_coefs": "altup_correct_coef.weight",
    "altup.correct_output_scale": "altup_correct_scale.weight", "laurel.left": "laurel_l.weight",
    "laurel.right": "laurel_r.weight", "laurel.norm": "laurel_post_norm.weight",
    "per_layer.gate": "inp_gate.weight", "per_layer.projection": "proj.weight", "per_layer.norm": "post_norm.weight",
}
SHARED_SPARE = ("attn_k.weight", "attn_v.weight", "attn_k_norm.weight", "attn_v_norm.weight")


def source(arch: Arch, gguf: GGUFFile, param: str, block: Optional[str], suffix: Optional[str]):
    """The tensor behind ``param`` where Gemma-3n departs from ``frontends.gguf.tensors``
    (None: the common layout holds)."""
    if param in TOP:
        return TensorSource(TOP[param])
    group, _, index = param.rpartition(".")
    if group in STACKS and index.isdigit():
        return Slab(STACKS[group], int(index))
    if suffix in LAYER:
        return TensorSource(block + LAYER[suffix])
    return None


def consumed(gguf: GGUFFile) -> set:
    """The shared layers' K/V tensors a file may keep, read by no param."""
    hp = Hparams(gguf)
    n, shared = hp.count("block_count"), hp.count("attention.shared_kv_layers", 0, minimum=0)
    return {f"blk.{i}.{name}" for i in range(max(n - shared, 0), n) for name in SHARED_SPARE} & set(gguf.tensors)


FAMILIES = {"gemma3n": describe_gemma3n}
