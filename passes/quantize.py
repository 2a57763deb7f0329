"""``quantize``: weight-only int4/int8 quantization (round-to-nearest, a per-group scale
search, or a search weighted by calibration statistics), quantized embedding tables and
tied LM heads, and an optional int8 KV cache."""
from __future__ import annotations

import logging
from typing import Optional

from irc import ops
from irc.build import emit1
from irc.errors import PassError
from irc.evaluate import text_tokens
from irc.graph import Graph, Param, Value
from irc.ops.quant import ACCURACY_LEVELS, BITS
from irc.passmanager import Pass, register_pass
from irc.quant_report import pass_report
from irc.text import format_bytes
from irc.rewrite.edit import is_graph_output, replace_node

from passes.quantize_awq import awq_fold
from passes.quantize_calibrate import importance, unobserved
from passes.quantize_gptq import SpilledWeight, calibrated_codes
from passes.quantize_delta import DELTA_OPERANDS, DELTA_WHY, STATE_REFUSAL, delta_rows, recurrence_params, split_rows
from passes.quantize_kv import CACHE_OPERANDS, cache_refusal, quantize_caches
from passes.quantize_methods import CALIBRATED, METHODS, QuantizedWeight, is_embedding_or_head, quantized_params
from passes.quantize_mixed import MORE_BITS, RECIPES, more_bits, wide_lines

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
PADDED_METHODS = ("rtn", "ort")  # a last block part padding is theirs to quantize (check_blocks)
DEFAULT_METHOD = "ort"  # the builder's scheme, compiled; mse degenerates on SmolLM2 (benchmarks/int4_quality.py)
# A method's own defaults over ``Quantize.options``: GPTQ's best measured setting
# (benchmarks/int4_quality.py: 0.21 to 0.55 of the builder's perplexity loss on SmolLM2-135M
# and Qwen2.5-Coder-0.5B over two runs, where 1024 tokens in natural order kept up to 0.82 of
# it), its calibration at 1.86 GB peak RSS on the Llama-3-8B shape (benchmarks/big_checkpoint.py's
# 2-layer cut, /usr/bin/time -v)
METHOD_DEFAULTS = {"gptq": {"calibration_tokens": 4096, "act_order": True}}


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
    where it does not divide a weight's K, ort and rtn pad the last block with zeros as
    MatMulNBits does, the searching methods refuse: ``check_blocks``), ``"channel"`` for one
    block per output row, or null (32 for 4 bits, per channel for 8 bits); ``symmetric``
    (default true: no zero points); ``method``: ``ort`` (the default: onnxruntime's compiled
    blockwise quantizer, the scheme of onnxruntime-genai's builder int4, codes -8..7:
    ``passes.quantize_ort``), ``rtn`` (max-abs round-to-nearest), ``mse`` (each group's
    scale, and zero point when asymmetric, searched to minimise its squared error),
    ``imatrix`` (that search weighted by each input channel's mean squared activation over
    ``calibration``, a text file tokenized with ``tokenizer``, a tokenizer.json, laid out as
    chat turns by the model's chat template with ``calibration_chat=true`` (``irc.chat``); its first
    ``calibration_tokens`` tokens, run through the reference interpreter layer by layer:
    ``passes.quantize_calibrate``) or ``gptq`` (error feedback with each weight's Hessian
    from the same calibration run through the quantized layers before it:
    ``passes.quantize_gptq``; ``act_order=true`` processes each weight's input columns by
    decreasing calibration energy, groups unchanged: its step 6; gptq's defaults are
    ``act_order=true`` and ``calibration_tokens=4096``, other methods' 1024 tokens, the best
    setting ``benchmarks/int4_quality.py`` measured: ``METHOD_DEFAULTS``),
    ``awq`` (per-input-channel scales searched on the same calibration run and folded exactly
    into the preceding norm or linear, each block's range clipped (searched too), then ``ort``
    codes: ``passes.quantize_awq``; run ``lower-mlp`` first); see
    ``passes.quantize_methods``. The default was chosen by
    ``benchmarks/int4_quality.py`` (greedy agreement and degenerate outputs on real models,
    not one perplexity): ``mse`` answered a prompt with a run of digits on SmolLM2-135M.
    ``accuracy_level`` (null, 0, 1, 2, 3, 4): MatMulNBits'
    activation precision, a backend hint (null: the target's default; the reference is
    always exact). ``embeddings`` (default true) quantizes the embedding table and the LM
    head too (a param read by ``embedding``, or named ``lm_head``; a tied pair as one set of
    codes), so "int4" is int4 throughout, as onnxruntime-genai's builder's int4 is;
    ``embeddings=false`` keeps both float, and then ``lm_head=true`` quantizes an untied
    head alone (with a head tied to the table that contradicts itself: PassError);
    ``kv_cache`` (default false). ``mixed``: which weights of a 4-bit quantization take 8
    bits, a named recipe (``passes.quantize_mixed``): ``none`` (every weight at ``bits``),
    ``q4_k_m`` (llama.cpp's Q4_K_M choice at 8 bits: an untied LM head, and the value and MLP
    down projections of the first and last eighth of the layers and every third between; a
    tied table+head stays 4-bit), ``q4_k_m_tied`` (the tied table+head at 8 bits too); each
    weight's bits and block are its nodes' attributes (MatMulNBits takes either width), and
    at ``bits=8`` nothing mixes. After a run, ``headline`` says how many weights became
    codes at each width and their size, which took 8 bits and why, and which tensors stayed
    float, their size and why.

    Always float: norm weights, routers, biases and every param that some reader takes in an
    operand outside ``WEIGHT_OPERANDS`` (a param is quantized for all its readers or none).
    Codes already stored are never quantized again: a second run changes nothing.

    Recurrent layers (Mamba, Mamba-2, gated DeltaNet, LFM2's short conv): their in/out
    projections quantize as above; the recurrence's own parameters (conv taps and bias,
    A_log, D, dt_bias) stay float, and by default so does the Δ path: every projection
    ``delta_rows`` traces from a recurrence's Δ operands (``DELTA_OPERANDS``: Mamba-1's
    x_proj and dt_proj, the delta rule's in_proj_a / in_proj_b / in_proj_ba), whose error
    would compound through the state at every step. Where the Δ is some rows of a larger
    projection (Mamba-2's dt rows of in_proj), ``split_rows`` cuts it into
    ``@<name>.rows_<start>_<stop>`` pieces joined by a concat (exact up to float rounding),
    the Δ rows float and the rest quantized. ``recurrent=true`` quantizes the Δ path too.
    The report's ``kept`` lists each param kept float on purpose with its reason, and
    ``positions`` (default 4096, 0: off) bounds its error-against-position curve
    (``irc.quant_report.position_curve``, reference interpreter over both graphs).
    ``recurrent_state=true`` (an int8 recurrent state) is refused (``STATE_REFUSAL``), and
    ``kv_cache=true`` notes that each recurrent state stays float.

    KV cache (``kv_cache=true``): ``passes.quantize_kv``; run ``mla-absorb`` before this.

    Not exact (``exact = False``): ``--check`` reports the error the quantization makes;
    ``report`` (the dump stats) gives per-tensor SQNR, and with ``evaluate_on(tokens)``
    (``irc compile --eval-text``) perplexity and top-1 agreement on a text.
    """

    name = "quantize"
    exact = False
    options = {"bits": 4, "group": None, "symmetric": True, "method": DEFAULT_METHOD, "accuracy_level": None,
               "embeddings": True, "lm_head": False, "kv_cache": False, "weights": True,
               "calibration": None, "tokenizer": None, "calibration_tokens": 1024, "calibration_chat": False,
               "recurrent": False, "recurrent_state": False, "positions": 4096, "act_order": False, "mixed": "none"}

    def __init__(self, **options):
        super().__init__(**options)
        self.options = {**type(self).options, **METHOD_DEFAULTS.get(self.config["method"], {})}
        self.config = c = {**self.options, **options}
        if c["bits"] not in BITS:
            raise PassError(f"pass quantize: bits must be 4 or 8, got {c['bits']!r}")
        group = c["group"]
        if group not in (None, "channel") and not (isinstance(group, int) and not isinstance(group, bool)
                                                   and group > 0 and group * c["bits"] % 8 == 0):
            raise PassError(f"pass quantize: group must be a positive block size filling whole bytes, "
                            f"'channel' or null, got {group!r}", hint="group=32, group=128 or group=channel")
        for key in ("symmetric", "embeddings", "lm_head", "kv_cache", "weights", "recurrent", "act_order",
                    "calibration_chat"):
            if not isinstance(c[key], bool):
                raise PassError(f"pass quantize: {key} must be true or false, got {c[key]!r}")
        if c["mixed"] not in RECIPES:
            raise PassError(f"pass quantize: unknown mixed recipe {c['mixed']!r}", hint=f"one of {', '.join(RECIPES)}")
        if c["method"] not in METHODS:
            raise PassError(f"pass quantize: unknown method {c['method']!r}", hint=f"one of {', '.join(METHODS)}")
        if c["accuracy_level"] not in ACCURACY_LEVELS:
            raise PassError(f"pass quantize: accuracy_level must be 0, 1, 2, 3 or 4, got {c['accuracy_level']!r}")
        if c["calibration_chat"] and c["method"] not in CALIBRATED:
            raise PassError(f"pass quantize: calibration_chat=true lays out a calibration text; method={c['method']} "
                            "reads none", hint=f"a calibrated method ({', '.join(sorted(CALIBRATED))}), or drop it")
        if c["method"] in CALIBRATED and not (c["calibration"] and c["tokenizer"]):
            raise PassError(f"pass quantize: method={c['method']} needs a calibration text and its tokenizer",
                            hint="quantize{method=imatrix,calibration=TEXT_FILE,tokenizer=MODEL/tokenizer.json}")
        if c["act_order"] and c["method"] != "gptq":
            raise PassError(f"pass quantize: act_order=true orders GPTQ's columns; method={c['method']} has no "
                            f"column order", hint="method=gptq,act_order=true, or drop act_order")
        tokens = c["calibration_tokens"]
        if not (isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 2):
            raise PassError(f"pass quantize: calibration_tokens must be an int >= 2, got {tokens!r}")
        positions = c["positions"]
        if not (isinstance(positions, int) and not isinstance(positions, bool) and positions >= 0):
            raise PassError(f"pass quantize: positions must be an int >= 0, got {positions!r}")
        if c["recurrent_state"] is not False:
            raise PassError(f"pass quantize: recurrent_state={c['recurrent_state']!r}: {STATE_REFUSAL}",
                            hint="benchmarks/quantize_recurrent.py measures an int8 state, simulated")
        self.notes: list[str] = []
        self.headline: list[str] = []  # what the compile prints: codes written, what stayed float and its MB
        self.reasons: dict[str, str] = {}
        self.wide: dict[str, str] = {}  # param name -> why it takes 8 bits (the mixed recipe)
        self.kept: list[dict] = []
        self.eval_tokens: Optional[list[int]] = None
        self.float_graph: Optional[Graph] = None
        self.last_report: Optional[dict] = None

    def evaluate_on(self, tokens: list[int]) -> None:
        """Add perplexity and top-1 agreement on ``tokens`` to ``report``, measured on the
        graph as this pass leaves it (``run`` computes the report then), so later passes
        (the ONNX targets' ``last-logits``) neither change it nor break it."""
        self.eval_tokens = list(tokens)

    def bits_of(self, name: str) -> int:
        """The bits of param ``name``: ``MORE_BITS`` where the ``mixed`` recipe chose it, else ``bits``."""
        return MORE_BITS if name in self.wide else self.config["bits"]

    def block_size(self, k: int, bits: Optional[int] = None) -> int:
        """The block along the input dim for a weight with ``k`` inputs: ``group``, but never
        wider than the smallest power of two >= max(k, 16) (a wider block holds only padding
        and quantizes the same); per channel, ``k`` (rounded up to even for 4 bits). With
        ``group`` null: 32 for a 4-bit quantization (its 8-bit weights of a ``mixed`` recipe
        too), per channel for an 8-bit one."""
        bits, group = bits or self.config["bits"], self.config["group"]
        if group is None:
            group = 32 if self.config["bits"] == 4 else "channel"
        if group == "channel":
            return k + (k % 2 if bits == 4 else 0)
        return min(group, 1 << (max(k, 16) - 1).bit_length())

    def run(self, graph: Graph) -> bool:
        self.notes, self.kept, self.headline, self.reasons, self.wide = [], [], [], {}, {}
        changed = False
        if self.config["weights"]:
            self.check_head(graph)
            chosen = {}
            for param, uses in weight_uses(graph).items():
                reason = self.refusal(graph, param, uses)
                if reason:
                    self.notes.append(f"quantize: @{param.name} stays {param.dtype}: {reason}")
                    self.reasons[param.name] = reason
                else:
                    chosen[param] = uses
            splits = self.recurrence_policy(graph, chosen)
            self.check_blocks(list(chosen))
            self.float_graph, self.last_report = (graph.clone() if chosen else None), None
            for param, ranges in splits.items():
                chosen.update(self.split(graph, param, ranges))
            self.wide = more_bits(graph, list(chosen), self.config["mixed"], self.config["bits"])
            stats = self.calibrate(graph, list(chosen))
            for param, uses in chosen.items():
                self.quantize_param(graph, param, uses, stats.get(param.name))
                changed = True
            self.headline = float_summary(graph, [p.name for p in chosen], self.reasons, self.config,
                                          self.blocks(chosen), self.wide) if chosen else []
        changed |= self.quantize_caches(graph)
        for note in self.notes:
            log.debug(note)
        if changed and self.eval_tokens is not None and self.float_graph is not None:
            self.report(graph)
        return changed

    def check_head(self, graph: Graph) -> None:
        """``lm_head=true`` with ``embeddings=false`` on a head tied to the table contradicts
        itself: the lookup and the head share one set of codes (PassError)."""
        if self.config["embeddings"] or not self.config["lm_head"]:
            return
        for param in graph.params.values():
            readers = {node.op for node in param.uses}
            if "embedding" in readers and readers & {"linear", "dequant_linear"}:
                raise PassError(f"quantize: lm_head=true asks for an int{self.config['bits']} head, but the head is "
                                f"tied to the embedding table @{param.name}, which embeddings=false keeps float "
                                f"(the lookup and the head share one table, so one set of codes)",
                                hint="drop embeddings=false (both quantized, the default) or lm_head=true "
                                     "(both float)")

    def keep(self, name: str, dtype, reason: str) -> None:
        self.notes.append(f"quantize: @{name} stays {dtype}: {reason}")
        self.reasons[name] = reason
        self.kept.append({"name": name, "reason": reason})

    def recurrence_policy(self, graph: Graph, chosen: dict) -> dict:
        """Take the Δ-path projections out of ``chosen`` (unless ``recurrent=true``), noting
        why; returns {param: float row ranges} for those whose Δ rows are only some of their
        rows (Mamba-2's in_proj), to be cut apart by ``split``."""
        for name, dtype, reason in recurrence_params(graph):
            self.keep(name, dtype, reason)
        if self.config["recurrent"]:
            return {}
        splits = {}
        for param, ranges in delta_rows(graph).items():
            if param not in chosen:
                continue
            whole = ranges == [(0, param.shape[0])]
            readers = [n for n in graph.users(param) if n.op != "linear" or n.inputs[1] is not param]
            if whole or readers:
                del chosen[param]
                why = "" if whole else f" (all of it: %{readers[0].name} ({readers[0].op}) reads it, rows cannot be cut)"
                self.keep(param.name, param.dtype, f"it makes the recurrence's Δ path{why}; {DELTA_WHY}")
            else:
                splits[param] = ranges
                del chosen[param]
        return splits

    def split(self, graph: Graph, param: Param, ranges: list) -> dict:
        """Cut ``param`` into row pieces (``split_rows``): the Δ rows stay float, the others
        join the weights to quantize (returned as {piece: uses})."""
        pieces = split_rows(graph, param, ranges)
        for start, stop, piece in pieces:
            if any(start >= a and stop <= b for a, b in ranges):
                self.keep(piece.name, piece.dtype, f"rows {start}:{stop} of @{param.name} make the recurrence's "
                          f"Δ; {DELTA_WHY}")
        quantized = {piece for *_, piece in pieces if piece.name not in {k["name"] for k in self.kept}}
        return {p: uses for p, uses in weight_uses(graph).items() if p in quantized}

    def quantize_caches(self, graph: Graph) -> bool:
        """``kv_cache=true``: each attention node's caches (``passes.quantize_kv``); a
        recurrent state stays float, with a note."""
        if not self.config["kv_cache"]:
            return False
        changed = False
        for node in list(graph.nodes):
            if node.op in DELTA_OPERANDS:
                self.notes.append(f"quantize: the recurrent state of %{node.name} ({node.op}) stays float: "
                                  f"kv_cache=true quantizes attention caches; {STATE_REFUSAL}")
            elif node.op in CACHE_OPERANDS:
                reason = cache_refusal(graph, node)
                if reason:
                    self.notes.append(f"quantize: caches of %{node.name} stay float: {reason}")
                    continue
                quantize_caches(graph, node)
                changed = True
        return changed

    def check_blocks(self, params: list) -> None:
        """PassError, before anything changes, for a weight with more than one block per row
        whose K the block does not divide, under a method that searches its scales per block
        (mse and the calibrated ones): their searches take whole blocks. rtn and ort pad the
        last block with zeros, as onnxruntime's MatMulNBits lays a row out (ceil(K / block)
        blocks; every target reads the same codes). One block spanning the row (per channel,
        or K up to the block) pads freely."""
        if self.config["method"] in PADDED_METHODS:
            return
        for param in params:
            k = param.shape[-1]
            block = self.block_size(k)
            if k > block and k % block:
                fits = [g for g in (16, 32, 64, 128, 256) if k % g == 0 and g * self.config["bits"] % 8 == 0]
                raise PassError(f"quantize: group {block} does not divide K={k} of @{param.name} "
                                f"{param.dtype}{list(param.shape)}, and method={self.config['method']} "
                                "searches whole blocks",
                                hint=f"{'group=' + str(fits[-1]) + ', ' if fits else ''}group=channel, or "
                                     "method=ort (it pads the last block)")

    def calibrate(self, graph: Graph, params: list) -> dict:
        """The calibrated method's statistics per weight name (none for other methods)."""
        c = self.config
        if c["method"] not in CALIBRATED or not params:
            return {}
        tokens = text_tokens(c["calibration"], c["tokenizer"], c["calibration_tokens"], what="calibration text",
                             chat=c["calibration_chat"])
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
        if c["method"] == "awq":  # scales searched and folded into the params now; codes are ort's
            _, skipped, notes = awq_fold(graph, tokens, params, c, self.block_size, self.bits_of)
            self.notes += notes + [f"quantize: awq leaves @{name} unscaled (ort codes): {why}"
                                   for name, why in sorted(skipped.items())]
            return {}
        if c["method"] == "gptq":  # codes chosen now, layer by layer, and kept on disk
            stats = calibrated_codes(graph, tokens, params, c, self.block_size, self.bits_of)
        else:
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
                return ("embeddings=false keeps the embedding table and LM head float" +
                        (" (lm_head=true quantizes an untied head alone)" if untied_head else ""))
        return None

    def quantize_param(self, graph: Graph, param: Param, uses: list, stats) -> None:
        c = self.config
        k, bits = param.shape[-1], self.bits_of(param.name)
        block = self.block_size(k, bits)
        method = c["method"] if stats is not None or c["method"] not in CALIBRATED or c["method"] == "awq" else "mse"
        weight = stats if isinstance(stats, SpilledWeight) else \
            QuantizedWeight(param, bits, block, c["symmetric"], method, stats)
        parts = quantized_params(graph, weight)
        attrs = {"K": k, "bits": bits, "block_size": block}
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

    def blocks(self, params) -> dict:
        """{bits: [block sizes used]} over the quantized ``params``."""
        used: dict = {}
        for p in params:
            bits = self.bits_of(p.name)
            used.setdefault(bits, set()).add(self.block_size(p.shape[-1], bits))
        return {bits: sorted(sizes) for bits, sizes in sorted(used.items())}

    def report(self, graph: Graph) -> dict:
        """Per-tensor SQNR (this method's and RTN's) and, after ``evaluate_on``, perplexity
        and top-1 agreement against the float graph (``irc.quant_report.pass_report``); kept
        as ``last_report``."""
        if self.float_graph is None:
            return {}
        self.last_report = pass_report(self.float_graph, graph, self.config["method"], self.eval_tokens,
                                       kept=self.kept, positions=self.config["positions"])
        return self.last_report


def float_summary(graph: Graph, quantized: list, reasons: dict, config: dict, blocks: dict, wide: dict,
                  listed: int = 4) -> list[str]:
    """The compile's lines on what ``quantize`` did: how many weights became codes per bit
    width (in blocks of ``blocks[bits]``, the sizes used) and their MB, which took 8 bits under
    the ``mixed`` recipe and why (``wide``: the head by name, the layer projections counted),
    and what stayed float: the largest float matrices by name with their MB and why
    (``listed`` of them, the rest counted), then the vectors (norms, biases) in one sum."""
    def parts_of(names) -> list:
        return [p for p in graph.params.values() if p.name.rsplit(".", 1)[0] in names
                and p.name.rsplit(".", 1)[-1] in ("qweight", "scales", "zero_points")]

    def block(sizes) -> str:
        return f"block {sizes[0]}" if len(sizes) == 1 else f"blocks {', '.join(map(str, sizes))}"

    parts = parts_of(set(quantized))
    narrow = [n for n in quantized if n not in wide]
    lines = [f"quantize: int{config['bits']} codes ({block(blocks[config['bits']])}, {config['method']}) for "
             f"{len(narrow)} weights, {format_bytes(sum(p.nbytes for p in parts_of(set(narrow))))}"
             if narrow else f"quantize: no int{config['bits']} codes"]
    if wide:
        lines[0] += (f"; int{MORE_BITS} ({block(blocks[MORE_BITS])}) for {len(wide)} more, "
                     f"{format_bytes(sum(p.nbytes for p in parts_of(set(wide))))} (mixed={config['mixed']})")
        lines += wide_lines(wide)
    floats = [p for p in graph.params.values() if p.dtype.is_float and p not in parts]
    matrices = sorted((p for p in floats if p.rank >= 2), key=lambda p: (-p.nbytes, p.name))
    vectors = [p for p in floats if p.rank < 2]
    for p in matrices[:listed]:
        why = reasons.get(p.name, "read where codes are not")
        lines.append(f"  float: @{p.name} {p.dtype}{list(p.shape)} {format_bytes(p.nbytes)} ({why})")
    if matrices[listed:]:
        rest = matrices[listed:]
        lines.append(f"  float: {len(rest)} more matrices, {format_bytes(sum(p.nbytes for p in rest))}")
    if vectors:
        lines.append(f"  float: {len(vectors)} vectors (norm weights, biases, ...), "
                     f"{format_bytes(sum(p.nbytes for p in vectors))}")
    return lines


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


__all__ = ["Quantize", "QuantizedWeight", "WEIGHT_OPERANDS", "CACHE_OPERANDS", "DEFAULT_METHOD", "DELTA_OPERANDS",
           "delta_rows", "recurrence_params", "split_rows"]
