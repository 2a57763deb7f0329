"""``quantize``: weight-only int4/int8 quantization (round-to-nearest, a per-group scale
search, or a search weighted by calibration statistics), quantized embedding tables and
tied LM heads, and an optional int8 KV cache."""
from __future__ import annotations

import logging
from typing import Optional

from irc import ops
from irc.build import emit1
from irc.dtypes import DType
from irc.errors import PassError
from irc.evaluate import text_tokens
from irc.graph import Graph, Param, Value
from irc.ops.quant import ACCURACY_LEVELS, BITS, block_count, packed_width
from irc.passmanager import Pass, register_pass
from irc.quant_report import pass_report
from irc.rewrite.edit import is_graph_output, replace_node
from irc.weights import Derived, materialize, read_rows

from passes.quantize_calibrate import importance, unobserved
from passes.quantize_kv import CACHE_OPERANDS, cache_refusal, quantize_caches
from passes.quantize_methods import CALIBRATED, METHODS, quantize_weight

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
    "mla_latent_attention": ("wq", "q_a", "q_b", "kv_a", "wo"),  # W^UK, W^UV: per-head blocks, kept
    "embedding": ("table",),
}
PARTS = ("qweight", "scales", "zero_points")
DEFAULT_METHOD = "mse"  # wins over rtn on SmolLM2-135M (passes.quantize_methods)


@register_pass
class Quantize(Pass):
    """Store weights as int8/int4 codes with per-block scales; optionally cache K/V in int8.

    Weights (``weights=true``, the default): each float param read only in weight operands
    (``WEIGHT_OPERANDS``: linear, the dense MLPs, MoE experts and shared expert, grouped
    expert GEMMs, MLA projections, and with ``embeddings=true`` the embedding table) becomes
    ``@<name>.qweight`` (u8), ``@<name>.scales`` (the source's float type) and, when
    asymmetric, ``@<name>.zero_points`` (u8), in ``irc.ops.quant``'s layout (ORT
    MatMulNBits'). Their data is ``irc.weights.Derived``, computed from the float source on
    demand (whole, or by rows), so a shape-only compile stays lazy. The float param is dropped.

    - ``linear(x, W, b)`` becomes ``dequant_linear(x, qweight, scales, zero_points?, b)``
      (MatMulNBits, 1:1), carrying ``accuracy_level`` when set;
    - ``embedding(ids, table)`` becomes ``dequant_embedding(ids, qweight, scales,
      zero_points?)``: only the looked-up rows are dequantized (GatherBlockQuantized). A tied
      head is a ``linear`` over the same table, so the lookup and the head share one set of
      codes and scales, as the checkpoint shares one table;
    - any other reader gets the float weight back from one ``dequantize`` node named after
      the param, emitted before its first reader. Run ``lower-mlp`` first to turn dense
      MLPs into ``dequant_linear``s.

    Options: ``bits`` 4 or 8; ``group`` the block size along the input dim (32, 64, 128, ...;
    it must divide every quantized weight's K, see ``block_size``), ``"channel"`` for one
    block per output row, or null (32 for 4 bits, per channel for 8 bits); ``symmetric``
    (default true: no zero points); ``method``: ``rtn`` (max-abs round-to-nearest),
    ``mse`` (each group's scale, and zero point when asymmetric, searched to minimise its
    squared error) or ``imatrix`` (that search weighted by each input channel's mean
    squared activation over ``calibration``, a text file tokenized with ``tokenizer``, a
    tokenizer.json; its first ``calibration_tokens`` tokens, run through the reference
    interpreter layer by layer: ``passes.quantize_calibrate``); see
    ``passes.quantize_methods``. ``accuracy_level`` (null, 0, 1, 2, 3, 4): MatMulNBits'
    activation precision, a backend hint (null: the target's default; the reference is
    always exact). ``embeddings`` (default false) also quantizes the embedding table and
    the LM head (a param read by ``embedding``, or named ``lm_head``); ``lm_head`` (default
    false) quantizes an untied LM head alone; ``kv_cache`` (default false).

    Always float: norm weights, routers, biases and every param that some reader takes in an
    operand outside ``WEIGHT_OPERANDS`` (a param is quantized for all its readers or none).
    Codes already stored are never quantized again: a second run changes nothing.

    KV cache (``kv_cache=true``): ``passes.quantize_kv``; run ``mla-absorb`` before this.

    Not exact (``exact = False``): ``--check`` reports the error the quantization makes;
    ``report`` (the dump stats) gives per-tensor SQNR, and with ``evaluate_on(tokens)``
    (``irc compile --eval-text``) perplexity and top-1 agreement on a text.
    """

    name = "quantize"
    exact = False
    options = {"bits": 4, "group": None, "symmetric": True, "method": DEFAULT_METHOD, "accuracy_level": None,
               "embeddings": False, "lm_head": False, "kv_cache": False, "weights": True,
               "calibration": None, "tokenizer": None, "calibration_tokens": 1024}

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
        if c["method"] not in METHODS:
            raise PassError(f"pass quantize: unknown method {c['method']!r}", hint=f"one of {', '.join(METHODS)}")
        if c["accuracy_level"] not in ACCURACY_LEVELS:
            raise PassError(f"pass quantize: accuracy_level must be 0, 1, 2, 3 or 4, got {c['accuracy_level']!r}")
        if c["method"] in CALIBRATED and not (c["calibration"] and c["tokenizer"]):
            raise PassError(f"pass quantize: method={c['method']} needs a calibration text and its tokenizer",
                            hint="quantize{method=imatrix,calibration=TEXT_FILE,tokenizer=MODEL/tokenizer.json}")
        tokens = c["calibration_tokens"]
        if not (isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 2):
            raise PassError(f"pass quantize: calibration_tokens must be an int >= 2, got {tokens!r}")
        self.notes: list[str] = []
        self.eval_tokens: Optional[list[int]] = None
        self.float_graph: Optional[Graph] = None
        self.last_report: Optional[dict] = None

    def evaluate_on(self, tokens: list[int]) -> None:
        """Add perplexity and top-1 agreement on ``tokens`` to ``report``, measured on the
        graph as this pass leaves it (``run`` computes the report then), so later passes
        (the ONNX targets' ``last-logits``) neither change it nor break it."""
        self.eval_tokens = list(tokens)

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
            chosen = []
            for param, uses in weight_uses(graph).items():
                reason = self.refusal(graph, param, uses)
                if reason:
                    self.notes.append(f"quantize: @{param.name} stays {param.dtype}: {reason}")
                else:
                    chosen.append((param, uses))
            self.check_blocks([param for param, _ in chosen])
            self.float_graph, self.last_report = (graph.clone() if chosen else None), None
            stats = self.calibrate(graph, [param for param, _ in chosen])
            for param, uses in chosen:
                self.quantize_param(graph, param, uses, stats.get(param.name))
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
        if changed and self.eval_tokens is not None and self.float_graph is not None:
            self.report(graph)
        return changed

    def check_blocks(self, params: list) -> None:
        """PassError, before anything changes, for a weight with more than one block per row
        whose K the block does not divide (a last block would be part padding). One block
        spanning the row (per channel, or K up to the block) pads freely."""
        for param in params:
            k = param.shape[-1]
            block = self.block_size(k)
            if k > block and k % block:
                fits = [g for g in (16, 32, 64, 128, 256) if k % g == 0 and g * self.config["bits"] % 8 == 0]
                raise PassError(f"quantize: group {block} does not divide K={k} of @{param.name} "
                                f"{param.dtype}{list(param.shape)}",
                                hint=f"{'group=' + str(fits[-1]) + ' or ' if fits else ''}group=channel")

    def calibrate(self, graph: Graph, params: list) -> dict:
        """The calibrated method's statistics per weight name (none for other methods)."""
        c = self.config
        if c["method"] not in CALIBRATED or not params:
            return {}
        tokens = text_tokens(c["calibration"], c["tokenizer"], c["calibration_tokens"], what="calibration text")
        vocab = graph.meta.get("vocab_size")
        if vocab and max(tokens) >= vocab:
            raise PassError(f"quantize: calibration token id {max(tokens)} is outside the vocabulary of {vocab}",
                            location=c["tokenizer"], hint="use the model's own tokenizer.json")
        missing = [p.name for p in graph.params.values() if p.data is None]
        if missing:
            raise PassError(f"quantize: method={c['method']} runs the model, but @{missing[0]} has no weights "
                            f"(a shape-only compile)", hint="compile a model folder, or give the output a target "
                            "that seeds absent weights")
        names = [p.name for p in params]
        stats = importance(graph, tokens, set(names))
        for name in unobserved(stats, names):
            self.notes.append(f"quantize: @{name} has no calibration statistics (its reader is not observed): "
                              f"quantized by the unweighted search (mse)")
        return stats

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

    def quantize_param(self, graph: Graph, param: Param, uses: list, stats) -> None:
        c = self.config
        k = param.shape[-1]
        block = self.block_size(k)
        method = c["method"] if stats is not None or c["method"] not in CALIBRATED else "mse"
        weight = QuantizedWeight(param, c["bits"], block, c["symmetric"], method, stats)
        parts = quantized_params(graph, weight)
        attrs = {"K": k, "bits": c["bits"], "block_size": block}
        level = {} if c["accuracy_level"] is None else {"accuracy_level": c["accuracy_level"]}
        dense: Optional[Value] = None
        for node, index in uses:
            if node.op == "linear":
                x, _, bias = (list(node.inputs) + [None])[:3]
                operands = [x, *(parts + [None])[:3], bias]
                while operands[-1] is None:
                    operands.pop()
                out = emit1(graph, "dequant_linear", operands, {**attrs, "N": param.shape[0], **level},
                            f"{node.outputs[0].name}.q", before=node, origin=node.origin)
                replace_node(graph, node, [out])
            elif node.op == "embedding" and index == 1:
                out = emit1(graph, "dequant_embedding", [node.inputs[0], *parts], {**attrs, **node.attrs},
                            f"{node.outputs[0].name}.q", before=node, origin=node.origin)
                replace_node(graph, node, [out])
            else:
                if dense is None:
                    dense = emit1(graph, "dequantize", parts, {**attrs, **level}, param.name, before=node,
                                  origin=node.origin)
                node.set_input(index, dense)
        del graph.params[param.name]

    def report(self, graph: Graph) -> dict:
        """Per-tensor SQNR (this method's and RTN's) and, after ``evaluate_on``, perplexity
        and top-1 agreement against the float graph (``irc.quant_report.pass_report``); kept
        as ``last_report``."""
        if self.float_graph is None:
            return {}
        self.last_report = pass_report(self.float_graph, graph, self.config["method"], self.eval_tokens)
        return self.last_report


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


class QuantizedWeight:
    """The quantization of one float param by one method, whole or by rows of the source.

    Each computation yields all parts at once; each part is handed out once from it and
    then forgotten, so reading qweight, scales and zero points of the same rows one after
    another costs one quantization, and nothing is held once all were read."""

    def __init__(self, source: Param, bits: int, block_size: int, symmetric: bool, method: str, importance=None):
        self.source, self.bits, self.block_size, self.symmetric = source, bits, block_size, symmetric
        self.method, self.importance = method, importance
        self._rows = None
        self._pending: dict = {}

    def part(self, name: str, rows: Optional[tuple] = None):
        if rows != self._rows or name not in self._pending:
            weight = materialize(self.source) if rows is None else read_rows(self.source, *rows)
            arrays = quantize_weight(weight, bits=self.bits, block_size=self.block_size, symmetric=self.symmetric,
                                     method=self.method, scale_dtype=self.source.dtype.numpy.name,
                                     importance=self.importance)
            self._rows, self._pending = rows, {p: a for p, a in zip(PARTS, arrays) if a is not None}
        return self._pending.pop(name)

    def scheme(self) -> str:
        return (f"bits={self.bits}, block_size={self.block_size}, "
                f"{'symmetric' if self.symmetric else 'asymmetric'}, {self.method}")


class QuantizedPart:
    """One part (qweight, scales or zero_points) of a ``QuantizedWeight``, as Derived data."""

    def __init__(self, weight: QuantizedWeight, part: str):
        self.weight, self.part = weight, part

    def __call__(self):
        return self.weight.part(self.part)

    def rows(self, start: int, stop: int):
        return self.weight.part(self.part, (start, stop))

    @property
    def share(self):  # the writer reads all parts of one weight, block by block, in one thread
        return self.weight

    @property
    def row_elements(self) -> int:  # source elements behind one row (sizes the writer's pieces)
        return self.weight.source.numel // max(self.weight.source.shape[0], 1)


def quantized_params(graph: Graph, weight: QuantizedWeight) -> list:
    """``@<source>.qweight``, ``.scales`` and (asymmetric) ``.zero_points``, lazily derived."""
    source, bits, block = weight.source, weight.bits, weight.block_size
    *lead, n, k = source.shape
    nb = block_count(k, block)
    shapes = {"qweight": (DType.u8, (*lead, n, nb, block * bits // 8)),
              "scales": (source.dtype, (*lead, n, nb)),
              "zero_points": (DType.u8, (*lead, n, packed_width(nb, bits)))}
    params = []
    for part in PARTS[:2] if weight.symmetric else PARTS:
        dtype, shape = shapes[part]
        param = graph.add_param(f"{source.name}.{part}", dtype, shape)
        param.data = Derived(QuantizedPart(weight, part), f"quantize @{source.name} ({weight.scheme()}): {part}")
        params.append(param)
    return params


__all__ = ["Quantize", "QuantizedWeight", "WEIGHT_OPERANDS", "CACHE_OPERANDS", "DEFAULT_METHOD"]
