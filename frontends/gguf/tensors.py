"""Where each irc param lives in a GGUF file, and reading it (lazily, one tensor at a time).

llama.cpp's names map onto irc's params (``frontends.hf.families`` uses the same irc
names): ``token_embd`` -> ``embed``, ``output_norm`` -> ``norm``, ``output`` -> ``lm_head``
(absent: tied), ``blk.N.attn_q`` -> ``layers.N.attn.wq``, ``blk.N.ffn_gate_exps`` ->
``layers.N.moe.w_gate`` ([E, d_ff, d], stacked as irc wants it), and so on (``LAYER``).
What llama.cpp's converter did to a tensor is undone on load:

- ``permute_heads``: Llama's Q and K rows (weights and biases) were permuted from
  rotate-half pairs to interleaved pairs per head; the inverse permutation is a reordering
  of whole rows, so a block-quantized tensor keeps its blocks;
- ``rows``: Phi-3's fused ``attn_qkv`` and gate+up ``ffn_up`` are split by rows;
- ``offset``: Gemma's norm weights are stored as 1 + w (irc's (1 + w) norm wants w);
- ``shape``: Qwen2-MoE's shared-expert gate is a vector [d]; irc's param is [1, d];
  the state-space tensors are squeezed or grouped (``frontends.gguf.ssm``);
- ``undo``: a named function of the float32 array, for a value stored transformed
  (Mamba's ``ssm_a`` holds -exp(A_log): ``frontends.gguf.ssm.a_log_from_a``);
- ``KvFromHalves``: DeepSeek's ``attn_k_b`` (transposed) and ``attn_v_b`` are joined back
  into ``kv_b`` (always in float: the transpose crosses blocks).

``TensorSource.read_float`` dequantizes with ``gguf``'s own dequantizer (bit-identical to
what transformers' GGUF loader computes); ``TensorSource.read_blocks`` keeps a block
format's codes (``frontends.gguf.blocks``) with the same row operations applied.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants
from gguf.quants import dequantize

from frontends.gguf.blocks import EXACT, repack
from frontends.gguf.forms import Form, form, in_form
from frontends.gguf.reader import GGUFFile
from irc.errors import SpecError

TOP = {"embed": "token_embd.weight", "norm": "output_norm.weight", "lm_head": "output.weight"}
LAYER = {  # irc name under layers.{i}. -> GGUF name under blk.{i}.
    "attn_norm": "attn_norm.weight", "mlp_norm": "ffn_norm.weight",
    "post_attn_norm": "post_attention_norm.weight", "post_mlp_norm": "post_ffw_norm.weight",
    "attn.wq": "attn_q.weight", "attn.wk": "attn_k.weight", "attn.wv": "attn_v.weight", "attn.wo": "attn_output.weight",
    "attn.bq": "attn_q.bias", "attn.bk": "attn_k.bias", "attn.bv": "attn_v.bias",
    "attn.q_norm": "attn_q_norm.weight", "attn.k_norm": "attn_k_norm.weight",
    "attn.q_a": "attn_q_a.weight", "attn.q_a_norm": "attn_q_a_norm.weight", "attn.q_b": "attn_q_b.weight",
    "attn.kv_a": "attn_kv_a_mqa.weight", "attn.kv_a_norm": "attn_kv_a_norm.weight", "attn.kv_b": "attn_kv_b.weight",
    "mlp.w_gate": "ffn_gate.weight", "mlp.w_up": "ffn_up.weight", "mlp.w_down": "ffn_down.weight",
    "moe.router": "ffn_gate_inp.weight", "moe.router_bias": "exp_probs_b.bias",
    "moe.w_gate": "ffn_gate_exps.weight", "moe.w_up": "ffn_up_exps.weight", "moe.w_down": "ffn_down_exps.weight",
    "moe.shared_gate": "ffn_gate_shexp.weight", "moe.shared_up": "ffn_up_shexp.weight",
    "moe.shared_down": "ffn_down_shexp.weight", "moe.shared_expert_gate": "ffn_gate_inp_shexp.weight",
}
FLOAT_TYPES = (T.F32, T.F16, T.BF16, T.F64)


def readable(ggml_type: T) -> bool:
    """Can irc read this tensor type: a float type, or one the ``gguf`` package dequantizes
    (it defines a class per such type in ``gguf.quants``)?"""
    return ggml_type in FLOAT_TYPES or hasattr(getattr(gguf_quants, ggml_type.name, None), "dequantize_blocks")


@dataclass(frozen=True)
class TensorSource:
    """One GGUF tensor behind a param, with the converter's changes undone (module docstring)."""

    name: str
    rows: Optional[tuple] = None
    permute_heads: Optional[int] = None
    offset: float = 0.0
    shape: Optional[tuple] = None
    undo: Optional[Callable] = None  # (float32 array, tensor name, file path) -> the param's values

    def names(self) -> list[str]:
        return [self.name]

    def stored_shape(self, gguf: GGUFFile) -> tuple:
        return gguf.tensor(self.name).shape

    def logical_shape(self, gguf: GGUFFile) -> tuple:
        shape = self.stored_shape(gguf)
        if self.rows is not None:
            start, stop = self.rows
            if len(shape) not in (1, 2) or shape[0] < stop:
                raise SpecError(f"tensor {self.name} {list(shape)} has no rows {start}:{stop}", location=gguf.path)
            shape = (stop - start, *shape[1:])  # a fused bias: entries [start, stop)
        if self.permute_heads is not None and shape[0] % (2 * self.permute_heads):
            raise SpecError(f"tensor {self.name} has {shape[0]} rows, not a whole number of heads "
                            f"({self.permute_heads}) of even width", location=gguf.path)
        if self.shape is not None:
            if int(np.prod(shape)) != int(np.prod(self.shape)):
                raise SpecError(f"tensor {self.name} {list(shape)} cannot be read as {list(self.shape)}",
                                location=gguf.path)
            shape = self.shape
        return tuple(shape)

    def ggml_type(self, gguf: GGUFFile) -> T:
        return gguf.tensor(self.name).ggml_type

    def exact(self, gguf: GGUFFile) -> bool:
        """Can the stored blocks be kept as they are (``read_blocks``)?"""
        return self.ggml_type(gguf) in EXACT and self.offset == 0.0 and self.shape is None and self.undo is None

    def reads_rows(self, gguf: GGUFFile) -> bool:
        """Can a slice of the param's first axis be read alone? (Not a reshaped vector.)"""
        return self.shape is None and len(self.stored_shape(gguf)) >= 2

    def _select(self, stored: np.ndarray, rows: Optional[tuple] = None) -> np.ndarray:
        """Rows [start, stop) of the param's first axis (all when None) taken from the
        stored array: a row range of a fused tensor, un-permuted by head for Llama's Q/K."""
        first, count = (0, stored.shape[0]) if self.rows is None else (self.rows[0], self.rows[1] - self.rows[0])
        start, stop = (0, count) if rows is None else rows
        if self.permute_heads is None:
            return stored[first + start:first + stop]
        heads = self.permute_heads
        order = np.arange(count).reshape(heads, count // heads // 2, 2).swapaxes(1, 2).reshape(-1)
        return stored[first + order[start:stop]]

    def read_float(self, gguf: GGUFFile, rows: Optional[tuple] = None) -> np.ndarray:
        """The tensor (or rows [start, stop) of it) as float32, in irc's layout."""
        entry = gguf.tensor(self.name)
        stored = self._select(np.asarray(entry.data), rows)
        if entry.ggml_type == T.F64:
            array = stored.astype(np.float32)
        else:
            array = dequantize(stored, entry.ggml_type).astype(np.float32, copy=False)
        if self.offset:
            array = array - np.float32(self.offset)
        if self.undo is not None:
            array = self.undo(array, self.name, gguf.path)
        return np.ascontiguousarray(array.reshape(self.shape) if self.shape is not None else array)

    def read_blocks(self, gguf: GGUFFile, rows: Optional[tuple] = None) -> tuple:
        """(qweight, scales, zero_points or None) of an ``exact`` tensor (``blocks.repack``),
        or of rows [start, stop) of it."""
        entry = gguf.tensor(self.name)
        return repack(self._select(np.asarray(entry.data), rows), entry.ggml_type, entry.shape[-1])

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class KvFromHalves:
    """DeepSeek's ``kv_b`` [H*(nope+v), kv_lora] from ``attn_k_b`` [H, kv_lora, nope] (stored
    transposed per head) and ``attn_v_b`` [H, v, kv_lora]."""

    k_b: str
    v_b: str

    def names(self) -> list[str]:
        return [self.k_b, self.v_b]

    def logical_shape(self, gguf: GGUFFile) -> tuple:
        k_shape, v_shape = gguf.tensor(self.k_b).shape, gguf.tensor(self.v_b).shape
        if len(k_shape) != 3 or len(v_shape) != 3 or k_shape[0] != v_shape[0] or k_shape[1] != v_shape[2]:
            raise SpecError(f"tensors {self.k_b} {list(k_shape)} and {self.v_b} {list(v_shape)} do not form one "
                            f"kv_b projection", location=gguf.path)
        heads, rank, nope = k_shape
        return heads * (nope + v_shape[1]), rank

    def exact(self, gguf: GGUFFile) -> bool:
        return False

    def read_float(self, gguf: GGUFFile) -> np.ndarray:
        k_b = TensorSource(self.k_b).read_float(gguf)
        v_b = TensorSource(self.v_b).read_float(gguf)
        joined = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)
        return np.ascontiguousarray(joined.reshape(-1, joined.shape[-1]))

    def __repr__(self) -> str:
        return f"{self.k_b} + {self.v_b}"


class FloatData:
    """Lazy ``Param.data``: the source tensor dequantized to float32 (then cast to
    ``dtype``); readable by rows (``irc.weights``) where the source is."""

    def __init__(self, gguf: GGUFFile, source, dtype):
        self.gguf, self.source, self.dtype = gguf, source, dtype

    def load(self) -> np.ndarray:
        return self.source.read_float(self.gguf).astype(self.dtype.numpy, copy=False)

    @property
    def reads_rows(self) -> bool:
        return isinstance(self.source, TensorSource) and self.source.reads_rows(self.gguf)

    def rows(self, start: int, stop: int) -> np.ndarray:
        return self.source.read_float(self.gguf, (start, stop)).astype(self.dtype.numpy, copy=False)

    def __repr__(self) -> str:
        return f"gguf({self.source!r})"


class BlockData:
    """Lazy ``Param.data``: one part (0 qweight, 1 scales, 2 zero_points) of a tensor's
    blocks in the form ``held`` (``frontends.gguf.forms``; default: the file's codes), whole
    or by rows; the parts of one tensor ``share`` it, so a streaming writer reads their rows
    together."""

    reads_rows = True

    def __init__(self, gguf: GGUFFile, source: TensorSource, part: int, held: Optional[Form] = None):
        self.gguf, self.source, self.part = gguf, source, part
        self.held = held or form(source.ggml_type(gguf), "exact")

    @property
    def share(self) -> TensorSource:
        return self.source

    def _parts(self, rows: Optional[tuple] = None) -> tuple:
        """The tensor's parts in the form ``held`` (``frontends.gguf.forms``)."""
        return in_form(self.source.read_blocks(self.gguf, rows), self.held)

    def load(self) -> np.ndarray:
        return self._parts()[self.part]

    def rows(self, start: int, stop: int) -> np.ndarray:
        return self._parts((start, stop))[self.part]

    def __repr__(self) -> str:
        return f"gguf({self.source!r}, {('qweight', 'scales', 'zero_points')[self.part]})"
