"""``quantize``: weight-only round-to-nearest quantization, and an optional int8 KV cache."""
from __future__ import annotations

import logging
from typing import Optional

from irc import ops
from irc.build import emit, emit1
from irc.dtypes import DType
from irc.errors import PassError
from irc.graph import Graph, Node, Param, Value
from irc.ops.quant import BITS, block_count, packed_width, quantize_blocks
from irc.passmanager import Pass, register_pass
from irc.weights import Derived, materialize
from irc.rewrite.edit import is_graph_output, replace_node

log = logging.getLogger(__name__)

# operands holding weights [..., out, in] that the pass quantizes, per op; every other
# operand (norm weights, routers and their bias, the shared-expert gate, biases) stays float
WEIGHT_OPERANDS = {
    "linear": ("weight",),
    "swiglu": ("w_gate", "w_up", "w_down"),
    "geglu": ("w_gate", "w_up", "w_down"),
    "gelu_mlp": ("w_up", "w_down"),
    "moe": ("w_gate", "w_up", "w_down", "shared_gate", "shared_up", "shared_down"),
    "grouped_gemm": ("w",),
    "mla_attention": ("wq", "q_a", "q_b", "kv_a", "kv_b", "wo"),
    "mla_absorbed_attention": ("wq_absorbed", "q_a", "q_b_absorbed", "kv_a", "wo_absorbed"),
    "embedding": ("table",),
}
# past-cache operands and the index of the present output each one becomes
CACHE_OPERANDS = {
    "attention": (("past_key", 1), ("past_value", 2)),
    "mla_attention": (("past_key", 1), ("past_value", 2)),
    "mla_absorbed_attention": (("past_latent", 1), ("past_rope", 2)),
}
PARTS = ("qweight", "scales", "zero_points")


@register_pass
class Quantize(Pass):
    """Store weights as RTN int8/int4 codes with per-block scales; optionally cache K/V in int8.

    Weights (``weights=true``, the default): each float param read only in weight operands
    (``WEIGHT_OPERANDS``: linear, the dense MLPs, MoE experts and shared expert, grouped
    expert GEMMs, MLA projections, and with ``embeddings=true`` the embedding table) becomes
    ``@<name>.qweight`` (u8), ``@<name>.scales`` (the source's float type) and, when
    asymmetric, ``@<name>.zero_points`` (u8), in ``irc.ops.quant``'s layout (ORT
    MatMulNBits'). Their data is ``irc.weights.Derived``, computed from the float source on
    demand, so a shape-only compile stays lazy (a source without data raises ValueError when
    loaded). The float param is dropped.

    - ``linear(x, W, b)`` becomes ``dequant_linear(x, qweight, scales, zero_points?, b)``
      (MatMulNBits, 1:1);
    - any other reader gets the float weight back from one ``dequantize`` node named after
      the param (``%layers.0.mlp.w_gate``), emitted before its first reader; the reading op
      is unchanged. Run ``lower-mlp`` first to turn dense MLPs into ``dequant_linear``s.

    Options: ``bits`` 4 or 8; ``group`` the block size along the input dim (32, 64, 128, any
    positive size filling whole bytes; see ``block_size`` for narrow weights), ``"channel"``
    for one block per output row, or null for the default (32 for 4 bits, per channel for
    8 bits); ``symmetric`` (default true: no
    zero points); ``embeddings`` (default false) also quantizes the embedding table and the
    LM head (a param read by ``embedding``, or named ``lm_head``: the tied head is the
    table itself); ``lm_head`` (default false) quantizes an untied LM head alone, as
    onnxruntime-genai's int4 builder does (the head is the largest matmul a small-vocabulary
    model reads per token); ``kv_cache`` (default false).

    Always float: norm weights, routers, biases and every param that some reader takes in an
    operand outside ``WEIGHT_OPERANDS`` (a param is quantized for all its readers or none).
    Codes already stored are never quantized again: a second run changes nothing.

    KV cache (``kv_cache=true``): each float past cache of an ``attention`` /
    ``mla_attention`` / ``mla_absorbed_attention`` that is a graph input read by that node
    alone, with its present cache a graph output and nothing else, becomes int8 codes plus
    float32 scales per head and token: inputs ``past_key_values.{i}.key`` i8[B,K,P,D] and
    ``past_key_values.{i}.key_scale`` f32[B,K,P] (and ``.value``/``.value_scale``), outputs
    ``present.{i}.key`` / ``present.{i}.key_scale`` likewise. The node reads
    ``dequantize_kv`` of the past and its float present goes through ``quantize_kv``; the
    tokens already cached keep their codes. Run ``mla-absorb`` before this.

    Not exact (``exact = False``): ``--check`` reports the error the quantization makes.
    """

    name = "quantize"
    exact = False
    options = {"bits": 4, "group": None, "symmetric": True, "embeddings": False, "lm_head": False,
               "kv_cache": False, "weights": True}

    def __init__(self, **options):
        super().__init__(**options)
        c = self.config
        if c["bits"] not in BITS:
            raise PassError(f"pass quantize: bits must be 4 or 8, got {c['bits']!r}")
        group = c["group"]
        if group not in (None, "channel") and not (isinstance(group, int) and not isinstance(group, bool)
                                                   and group > 0 and group * c["bits"] % 8 == 0):
            raise PassError(f"pass quantize: group must be a positive block size filling whole bytes, "
                            f"'channel' or null, got {group!r}", hint="group=32, group=128 or group=channel")
        for key in ("symmetric", "embeddings", "lm_head", "kv_cache", "weights"):
            if not isinstance(c[key], bool):
                raise PassError(f"pass quantize: {key} must be true or false, got {c[key]!r}")
        self.notes: list[str] = []

    def block_size(self, k: int) -> int:
        """The block along the input dim for a weight with ``k`` inputs: ``group``, but never
        wider than the smallest power of two >= max(k, 16) (a wider block holds only padding
        and quantizes the same); per channel, ``k`` (rounded up to even for 4 bits)."""
        bits, group = self.config["bits"], self.config["group"]
        if group is None:
            group = 32 if bits == 4 else "channel"
        if group == "channel":
            return k + (k % 2 if bits == 4 else 0)
        return min(group, 1 << (max(k, 16) - 1).bit_length())

    def run(self, graph: Graph) -> bool:
        self.notes = []
        changed = False
        if self.config["weights"]:
            for param, uses in weight_uses(graph).items():
                reason = self.refusal(graph, param, uses)
                if reason:
                    self.notes.append(f"quantize: @{param.name} stays {param.dtype}: {reason}")
                    continue
                self.quantize_param(graph, param, uses)
                changed = True
        if self.config["kv_cache"]:
            for node in list(graph.nodes):
                if node.op in CACHE_OPERANDS:
                    reason = cache_refusal(graph, node)
                    if reason:
                        self.notes.append(f"quantize: caches of %{node.name} stay float: {reason}")
                        continue
                    quantize_caches(graph, node)
                    changed = True
        for note in self.notes:
            log.debug(note)
        return changed

    def refusal(self, graph: Graph, param: Param, uses: list) -> Optional[str]:
        """Why ``param`` stays float, or None."""
        if is_graph_output(graph, param):
            return "it is a graph output"
        for node in graph.users(param):
            names = ops.get_op(node.op).operand_names(len(node.inputs))
            for index, value in enumerate(node.inputs):
                if value is param and (node, index) not in uses:
                    return f"%{node.name} ({node.op}) reads it as {names[index]}, which stays float"
        if not self.config["embeddings"] and is_embedding_or_head(param):
            untied_head = not any(node.op == "embedding" for node in param.uses)
            if not (self.config["lm_head"] and untied_head):
                return "embedding / LM head (quantize{embeddings=true} or {lm_head=true} includes them)"
        return None

    def quantize_param(self, graph: Graph, param: Param, uses: list) -> None:
        bits, k = self.config["bits"], param.shape[-1]
        block = self.block_size(k)
        parts = quantized_params(graph, param, bits, block, self.config["symmetric"])
        attrs = {"K": k, "bits": bits, "block_size": block}
        weight: Optional[Value] = None
        for node, index in uses:
            if node.op == "linear":
                x, _, bias = (list(node.inputs) + [None])[:3]
                operands = [x, *(parts + [None])[:3], bias]
                while operands[-1] is None:
                    operands.pop()
                out = emit1(graph, "dequant_linear", operands, {**attrs, "N": param.shape[0]},
                            f"{node.outputs[0].name}.q", before=node, origin=node.origin)
                replace_node(graph, node, [out])
                continue
            if weight is None:
                weight = emit1(graph, "dequantize", parts, attrs, param.name, before=node, origin=node.origin)
            node.set_input(index, weight)
        del graph.params[param.name]


def weight_uses(graph: Graph) -> dict[Param, list]:
    """Float params read in weight operands: param -> [(node, operand index)] in graph order."""
    uses: dict[Param, list] = {}
    for node in graph.nodes:
        wanted = WEIGHT_OPERANDS.get(node.op)
        if not wanted:
            continue
        names = ops.get_op(node.op).operand_names(len(node.inputs))
        for index, (name, value) in enumerate(zip(names, node.inputs)):
            if name in wanted and isinstance(value, Param) and value.dtype.is_float and value.rank >= 2:
                uses.setdefault(value, []).append((node, index))
    return uses


def is_embedding_or_head(param: Param) -> bool:
    """An embedding table (read by ``embedding``) or an LM head (named ``lm_head``)."""
    return param.name.split(".")[-1] == "lm_head" or any(node.op == "embedding" for node in param.uses)


class QuantizedPart:
    """One part (qweight, scales or zero_points) of the RTN quantization of ``source``."""

    def __init__(self, source: Param, part: str, bits: int, block_size: int, symmetric: bool):
        self.source, self.part, self.bits, self.block_size, self.symmetric = source, part, bits, block_size, symmetric

    def __call__(self):
        parts = quantize_blocks(materialize(self.source), bits=self.bits, block_size=self.block_size,
                                symmetric=self.symmetric, scale_dtype=self.source.dtype.numpy.name)
        return parts[PARTS.index(self.part)]


def quantized_params(graph: Graph, source: Param, bits: int, block: int, symmetric: bool) -> list:
    """``@<source>.qweight``, ``.scales`` and (asymmetric) ``.zero_points``, lazily derived."""
    *lead, n, k = source.shape
    nb = block_count(k, block)
    shapes = {"qweight": (DType.u8, (*lead, n, nb, block * bits // 8)),
              "scales": (source.dtype, (*lead, n, nb)),
              "zero_points": (DType.u8, (*lead, n, packed_width(nb, bits)))}
    scheme = f"bits={bits}, block_size={block}, {'symmetric' if symmetric else 'asymmetric'}"
    params = []
    for part in PARTS[:2] if symmetric else PARTS:
        dtype, shape = shapes[part]
        param = graph.add_param(f"{source.name}.{part}", dtype, shape)
        param.data = Derived(QuantizedPart(source, part, bits, block, symmetric),
                             f"quantize @{source.name} ({scheme}): {part}")
        params.append(param)
    return params


# ---- KV cache --------------------------------------------------------------------------------

def _cache_slots(node: Node) -> list:
    """(operand index, past value, present value) for each past-cache operand of ``node``."""
    names = ops.get_op(node.op).operand_names(len(node.inputs))
    slots = []
    for name, output in CACHE_OPERANDS[node.op]:
        if name in names[:len(node.inputs)]:
            index = names.index(name)
            if node.inputs[index] is not None and output < len(node.outputs):
                slots.append((index, node.inputs[index], node.outputs[output]))
    return slots


def cache_refusal(graph: Graph, node: Node) -> Optional[str]:
    slots = _cache_slots(node)
    if len(slots) != len(CACHE_OPERANDS[node.op]):
        return "no past caches"
    for _, past, present in slots:
        if not any(v is past for v in graph.inputs):
            return f"%{past.name} is not a graph input"
        if not past.dtype.is_float:
            return f"%{past.name} is already {past.dtype}"
        if graph.users(past) != [node] or len(past.uses) != 1 or is_graph_output(graph, past):
            return f"%{past.name} has other readers"
        if present.uses or not is_graph_output(graph, present):
            return f"%{present.name} is not only a graph output"
    return None


def quantize_caches(graph: Graph, node: Node) -> None:
    """Retype the past caches of ``node`` to int8 + scale inputs and quantize its presents."""
    slots = _cache_slots(node)
    operands = list(node.inputs)
    for index, past, _ in slots:
        dtype = past.dtype
        past.dtype = DType.i8
        scale = graph.add_input(f"{past.name}_scale", DType.f32, past.shape[:-1])
        graph.inputs.remove(scale)
        graph.inputs.insert(graph.inputs.index(past) + 1, scale)
        operands[index] = emit1(graph, "dequantize_kv", [past, scale], {"dtype": str(dtype)},
                                f"{past.name}.dequantized", before=node, origin=node.origin)
    hints = [f"{out.name}.float" if any(out is p for *_, p in slots) else f"{out.name}.new" for out in node.outputs]
    outputs = emit(graph, node.op, operands, dict(node.attrs), hints, before=node, origin=node.origin)
    replacements = list(outputs)
    scales = []
    for index, past, present in slots:
        position = node.outputs.index(present)
        codes, scale = emit(graph, "quantize_kv", [outputs[position]], None,
                            [f"{present.name}.codes", f"{present.name}_scale"], before=node, origin=node.origin)
        replacements[position] = codes
        scales.append((present.name, scale))
    replace_node(graph, node, replacements)
    for name, scale in scales:
        position = next(i for i, v in enumerate(graph.outputs) if v.name == name)
        graph.outputs.insert(position + 1, scale)


__all__ = ["Quantize", "QuantizedPart", "WEIGHT_OPERANDS", "CACHE_OPERANDS"]
