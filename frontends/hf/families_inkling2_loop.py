"""Thinking Machines' Inkling-2-Loop text decoder (``inkling2_loop_text``): Inkling-2's layers
(``frontends.hf.families_inkling2``) with the layers ``loop_layer_index_start`` to
``loop_layer_index_end`` − 1 run ``loop_num_passes`` times, each pass after the first fed
messages from the one before (``frontends.hf.families`` registers it).

transformers' ``Inkling2LoopTextModel``, unrolled exactly into a static graph (the pass count
and the layer ranges are config constants, as ``families_loops`` unrolls HRM and Dory)::

    pre-loop layers;  (x0, B0) = (x, B)
    pass 1: the loop layers as Inkling-2 layers
    pass p > 1: P = the blocks pass p−1 added after its first, y = its output;  (x, B) = (x0, B0)
        loop layer j: M = mix_j(P, y) (four queries: q, k, v, mlp — ``message_input``)
        each of the layer's attention inputs and its MLP input h becomes g(h, M_w):
        g(h, m) = (1 − tanh(F z)) · h + tanh(G z) · m,  z = D [ν(h) | ν(m)]
        (ν an unweighted RMS norm of ``rms_norm_eps``; D [rank, 2d], F and G [d, rank]:
        ``controllers.{attn,k,v,mlp}``, ``loop_gate_rank``)
    post-loop layers; the final mix, norm and softcapped head as Inkling-2's.

Every layer invocation has caches of its own (``past_key_values.{k}.*``, k counting the
invocations in the order they run: transformers' extra cache layers for the later passes)
and reads the weights of the layer it runs (one param each). The message queries are read
as the checkpoint holds them: ``middle_cycle_cross_pass_queries`` rows 2j, 2j+1 (q, mlp) and
``middle_cycle_cross_pass_kv_queries`` rows 2j, 2j+1 (k, v) of loop layer j. A
``loop_config`` block (``core_start``, ``core_end``, ``num_passes``, ``gate_rank``) overrides
the four keys, as ``__post_init__`` reads it.

Refused, naming the key (transformers' ``validate_architecture``, and ranges it would index
past): ``loop_num_passes`` < 1, ``loop_layer_index_start`` 0 or not a multiple of
``n_layers_per_attn_res_block``, an end not such a multiple, not after the start, or past
``num_hidden_layers``; and whatever Inkling-2 refuses.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import partial

from frontends.dsl import Model
from frontends.hf.config import Arch, Config
from frontends.hf.families_inkling import _e, _linear
from frontends.hf.families_inkling2 import DEFAULTS as INKLING2, LAYOUTS as INKLING2_LAYOUTS
from frontends.hf.families_inkling2 import _inkling2, finish, layer_block, mix, start
from frontends.hf.weights import Rows
from irc.yamlloc import Bad, layer_count, positive_int

DEFAULTS = {  # transformers 5.25's Inkling2LoopTextConfig
    "inkling2_loop_text": {
        **INKLING2["inkling2_text"], "hidden_size": 2304, "num_hidden_layers": 24, "num_attention_heads": 24,
        "swa_num_attention_heads": 24, "log_scaling_n_floor": 8192, "moe_intermediate_size": 1152,
        "n_routed_experts": 128, "loop_layer_index_start": 6, "loop_layer_index_end": 18, "loop_num_passes": 3,
        "loop_gate_rank": 64},
}
LOOP_KEYS = {"loop_layer_index_start": "core_start", "loop_layer_index_end": "core_end",
             "loop_num_passes": "num_passes", "loop_gate_rank": "gate_rank"}
LAYER = re.compile(r"layers\.(\d+)\.(.+)")


@dataclass
class Loop:
    start: int
    end: int
    passes: int
    rank: int


def _loop_key(cfg: Config, key: str) -> str:
    """Where ``key`` is read: ``loop_config.{name}`` when that block holds it, else ``key``."""
    block = cfg.raw("loop_config")
    return f"loop_config.{LOOP_KEYS[key]}" if isinstance(block, dict) and LOOP_KEYS[key] in block else key


def _loop_value(cfg: Config, key: str) -> int:
    where = _loop_key(cfg, key)
    if where == key:
        return cfg.get(key, positive_int)
    try:
        return positive_int(cfg.raw("loop_config")[LOOP_KEYS[key]])
    except Bad as err:
        raise cfg.error(where, str(err)) from None


def _loop(cfg: Config, name: str, model_type: str) -> Arch:
    """Inkling-2-Loop (see the module docstring)."""
    arch = _inkling2(cfg, name, model_type)
    s, n = arch.expand.args[0], arch.n_layers
    loop = Loop(*(_loop_value(cfg, key) for key in LOOP_KEYS))
    if loop.start % s.block:
        raise cfg.error(_loop_key(cfg, "loop_layer_index_start"),
                        f"{loop.start} is not a multiple of n_layers_per_attn_res_block {s.block}")
    if loop.end % s.block or not loop.start < loop.end <= n:
        raise cfg.error(_loop_key(cfg, "loop_layer_index_end"),
                        f"{loop.end} must be a multiple of n_layers_per_attn_res_block {s.block} after the loop's "
                        f"start {loop.start}, at most num_hidden_layers {n}")
    runs = n + (loop.passes - 1) * (loop.end - loop.start)
    try:
        layer_count(runs)
    except Bad as err:
        raise cfg.error(_loop_key(cfg, "loop_num_passes"), f"{runs} layer invocations: {err}") from None
    layers = [replace(arch.layers[j]) for j in _order(n, loop)]
    return replace(arch, n_layers=runs, layers=layers, checkpoint="inkling2_loop_text",
                   expand=partial(_graph, s, loop))


def _order(n: int, loop: Loop) -> list:
    """The layer each invocation runs, in order."""
    core = list(range(loop.start, loop.end))
    return list(range(loop.end)) + core * (loop.passes - 1) + list(range(loop.end, n))


class _Shared(Model):
    """A model whose layer invocations read their layer's params: ``alias`` maps an invocation
    index to its layer; a param made again is the one made first."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.alias: dict = {}

    def param(self, name: str, shape):
        match = LAYER.fullmatch(name)
        if match and int(match.group(1)) in self.alias:
            name = f"layers.{self.alias[int(match.group(1))]}.{match.group(2)}"
        existing = self._graph.params.get(name)
        if existing is not None:
            if tuple(existing.shape) != tuple(shape):
                raise self.error("name", f"param @{name} is {list(existing.shape)}, not {list(shape)}")
            return existing
        return super().param(name, shape)


def _gate(layer, loop: Loop, messages: dict, which: str, h):
    """``Inkling2LoopMessageGate`` ``which`` of this layer: h mixed with its message."""
    m, p, d = layer.model, f"{layer.prefix}{which}_message_gate", layer.model.d_model
    message = messages[which]
    normed = [m.plain_rms_norm(x, f"{p}_{tag}_normed", layer.eps) for x, tag in ((h, "h"), (message, "m"))]
    z = _linear(m, _e(m, "concat", normed, f"{p}_in", {"axis": -1}), m.param(f"{p}.down", (loop.rank, 2 * d)),
                f"{p}_z")
    forget = _e(m, "tanh", [_linear(m, z, m.param(f"{p}.forget", (d, loop.rank)), f"{p}_forget_in")], f"{p}_forget")
    gain = _e(m, "tanh", [_linear(m, z, m.param(f"{p}.gain", (d, loop.rank)), f"{p}_gain_in")], f"{p}_gain")
    keep = _e(m, "sub", [_e(m, "constant", [], f"{p}_one", {"value": 1.0}), forget], f"{p}_keep")
    return _e(m, "add", [_e(m, "mul", [keep, h], f"{p}_kept"), _e(m, "mul", [gain, message], f"{p}_sent")], p)


def _messages(m: Model, j: int, previous: list, y) -> dict:
    """Loop layer j's four messages (``Inkling2LoopMessageAttentionResidual``)."""
    p = f"layers.{j}."
    q_mlp, k_v = m.param(f"{p}message_queries", (2, m.d_model)), m.param(f"{p}message_kv_queries", (2, m.d_model))
    rows = [_e(m, "slice", [q_mlp], f"{p}message_q", {"axis": 0, "start": 0, "end": 1}), k_v,
            _e(m, "slice", [q_mlp], f"{p}message_mlp", {"axis": 0, "start": 1, "end": 2})]
    query = _e(m, "concat", rows, f"{p}message_query_rows", {"axis": 0})
    return dict(zip(("q", "k", "v", "mlp"), mix(m, f"{p}message", previous, y, 4, query=query)))


def _graph(s, loop: Loop, arch: Arch, origin: str):
    m = _Shared(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    order = _order(len(s.kinds), loop)
    with m.at(origin):
        x, slots, tau = start(m, s, arch)
        blocks: list = []
        invocations = iter(m.layers(arch.n_layers))
        saved = previous = None
        for k, j in enumerate(order):
            layer = next(invocations)
            layer.eps, m.alias[k] = arch.norm_eps, j
            gate = None
            if j == loop.start:
                if saved is None:
                    saved = (x, blocks)
                else:  # a later pass: messages from the last one, restarting from the pre-loop states
                    previous = (blocks[len(saved[1]) + 1:], x)
                    x, blocks = saved
            if previous is not None and j < loop.end and k >= loop.end:
                messages = _messages(m, j, *previous)
                gate = partial(_gate, layer, loop, messages)
            x, blocks = layer_block(layer, x, blocks, s, slots, tau, j, gate)
        finish(m, s, arch, x, blocks)
    return m.graph


def _message_rows(kind: str):
    def source(arch: Arch, prefix: str) -> Rows:
        j = int(prefix.rstrip(".").rsplit(".", 1)[1]) - arch.expand.args[1].start
        return Rows(f"model.llm.middle_cycle_cross_pass_{kind}", 2 * j, 2 * j + 2)
    return source


_LAYOUT = dict(INKLING2_LAYOUTS["inkling2_text"])
_LAYOUT.update({f"{w}_message_gate.{part}": f"controllers.{name}.{part}_weight"
                for w, name in (("q", "attn"), ("k", "k"), ("v", "v"), ("mlp", "mlp"))
                for part in ("down", "forget", "gain")})
_LAYOUT.update({"message_queries": _message_rows("queries"), "message_kv_queries": _message_rows("kv_queries")})

FAMILIES = {"inkling2_loop_text": _loop}
LAYOUTS = {"inkling2_loop_text": _LAYOUT}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
