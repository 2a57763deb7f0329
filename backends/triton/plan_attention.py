"""Planning RoPE and attention (part of ``backends.triton.plan.Planner``).

- ``rope``: cos/sin tables once per forward per RoPE configuration (torch), then the rope
  kernel: in place on the q/k projection buffer when nothing else reads it, straight into
  the present KV cache when the rotated k only feeds an attention with a past cache;
- ``attention``: the present caches were allocated up front (``Planner._present_caches``);
  new V rows (and K rows not written by RoPE) are copied in by ``store_heads``, then the
  flash-attention launcher picks the prefill or split-KV decode kernel by T; GPT-OSS's sinks
  [H] are an operand of those kernels (their online softmax starts from the sink:
  ``backends.triton.kernels.attention``), never a refusal.
"""
from __future__ import annotations

import json
from typing import Optional

import numpy as np

from irc.dtypes import DType
from irc.errors import BackendError
from irc.graph import Node, Value
from irc.ops.registry import pad_inputs
from irc.ops.rope import mrope_tables, rope_inv_freq, rope_switch

from backends.triton.kernels import attention as attention_kernels
from backends.triton.kernels import torch_type
from backends.triton.kernels import rope


# ops whose torch fallback returns a view of its operand: never written in place
VIEW_OPS = ("reshape", "expand")


class AttentionPlanning:
    """Mixin: needs the Planner's var/alloc/step/use_kernel/helpers/weights/steps."""

    def cos_sin(self, positions: Value, rotary: int, base: float, scaling) -> tuple[str, str]:
        """Variables holding cos/sin [B, T, rotary/2] for this RoPE configuration (computed
        once per forward, on first use)."""
        key = (positions.name, rotary, float(base), json.dumps(scaling, sort_keys=True))
        if key not in self.rope_tables:
            k = len(self.rope_tables)
            pos = self.var(positions)
            if (scaling or {}).get("kind") == "dynamic":
                self.helpers.add("dynamic_inv_freq")
                inv = (f"dynamic_inv_freq({rotary}, {float(base)!r}, {float(scaling['factor'])!r}, "
                       f"{int(scaling['original_max_position'])}, {pos})")
                factor = 1.0
            else:
                inv_freq, factor = rope_inv_freq(rotary, base, scaling)
                self.weights[f"rope.{k}.inv_freq"] = np.asarray(inv_freq, np.float32)
                inv = f"W['rope.{k}.inv_freq']"
                switch = rope_switch(rotary, base, scaling)
                if switch is not None:  # LongRoPE: the long set once max(positions) + 1 > switch[2]
                    self.weights[f"rope.{k}.long_inv_freq"] = switch[1]
                    self.helpers.add("longrope_inv_freq")
                    inv = f"longrope_inv_freq({inv}, W['rope.{k}.long_inv_freq'], {switch[2]}, {pos})"
            self.helpers.add("rope_tables")
            line = f"cos_{k}, sin_{k} = rope_tables({pos}, {inv}, {float(factor)!r})"
            self.step([], [line], torch_ops=["rope tables"])
            self.rope_tables[key] = (f"cos_{k}", f"sin_{k}")
        return self.rope_tables[key]

    def mrope_cos_sin(self, positions: Value, rotary: int, base: float, mrope: dict) -> tuple[str, str]:
        """Variables holding cos/sin [B, T, rotary/2] of multi-axis positions [A, B, T]
        (``irc.ops.rope.mrope_tables``: an axis and a frequency per rotated pair)."""
        key = (positions.name, rotary, float(base), json.dumps(mrope, sort_keys=True))
        if key not in self.rope_tables:
            k = len(self.rope_tables)
            axis, inv_freq = mrope_tables(rotary, base, mrope)
            self.weights[f"rope.{k}.axis"] = np.asarray(axis, np.int64)
            self.weights[f"rope.{k}.inv_freq"] = np.asarray(inv_freq, np.float32)
            self.helpers.add("mrope_tables")
            line = f"cos_{k}, sin_{k} = mrope_tables({self.var(positions)}, W['rope.{k}.axis'], W['rope.{k}.inv_freq'])"
            self.step([], [line], torch_ops=["rope tables"])
            self.rope_tables[key] = (f"cos_{k}", f"sin_{k}")
        return self.rope_tables[key]

    def rope_kernel(self, convention: str, dtype: DType, nodes) -> str:
        return self.use_kernel(f"rope_{convention}", lambda n: rope.rope_kernel(n, convention, dtype), nodes)

    def store_kernel(self, dtype: DType, nodes) -> str:
        return self.use_kernel("store_heads", lambda n: rope.store_heads_kernel(n, dtype), nodes)

    def _rope(self, node: Node) -> None:
        x, positions = node.inputs
        out = node.outputs[0]
        attrs = node.attrs
        head_dim = attrs["head_dim"]
        rotary = head_dim if attrs["rotary_dim"] is None else attrs["rotary_dim"]
        if attrs.get("mrope"):  # Qwen-VL's multi-axis positions: each pair reads its axis
            cos, sin = self.mrope_cos_sin(positions, rotary, attrs["base"], attrs["mrope"])
        else:
            cos, sin = self.cos_sin(positions, rotary, attrs["base"], attrs["scaling"])
        name = self.rope_kernel(attrs["convention"], x.dtype, [node])
        batch, seq = x.shape[:2]
        heads = f"-1, {head_dim}"
        cache = self._cache_target(out)
        source = f"{self.var(x)}.reshape({batch}, {seq}, {heads})"
        in_place = f"{self.var(x)}.view({batch}, {seq}, {heads})"
        if cache is not None:
            target = f"{cache}[:, :, {cache}.shape[2] - {seq}:].transpose(1, 2)"
            self.cache_of[out.name] = cache
            self.step([node], [f"launch_{name}({source}, {target}, {cos}, {sin}, {rotary})"], kernels=[name])
        elif self.single_use(x) and x not in self.graph.outputs and x.producer.op not in VIEW_OPS:
            self.alias(out, self.var(x))
            self.step([node], [f"launch_{name}({in_place}, {in_place}, {cos}, {sin}, {rotary})  # in place"],
                      kernels=[name])
        else:
            self.step([node], [self.alloc(out), f"launch_{name}({source}, {self.var(out)}.view({batch}, {seq}, "
                                                f"{heads}), {cos}, {sin}, {rotary})"], kernels=[name])

    def _cache_target(self, value: Value) -> Optional[str]:
        """The present cache var a rotated k goes straight into (its only reader is an
        attention's k operand, and that attention has a past cache)."""
        if not self.single_use(value) or value in self.graph.outputs:
            return None
        user = value.uses[0]
        if user.op == "attention" and user.inputs[1] is value and len(user.outputs) == 3 \
                and user.outputs[1].name not in self.late_caches:
            return self.var(user.outputs[1])
        return None

    def _attention(self, node: Node) -> None:
        q, k, v, mask, _, _, sinks, blocks, alibi = pad_inputs(node.inputs, 9)
        attrs = node.attrs
        if not attrs["causal"] and attrs["window"] is not None:  # the kernels' window looks back only
            raise BackendError(f"{node.outputs[0].name}: the Triton kernels have no symmetric window for "
                               "bidirectional attention", hint="compile it with --target onnx or onnx-ort")
        heads, kv_heads, head_dim = attrs["heads"], attrs["kv_heads"], attrs["head_dim"]
        v_dim = head_dim if attrs["v_head_dim"] is None else attrs["v_head_dim"]
        batch, seq = q.shape[:2]
        out = node.outputs[0]
        features = attention_kernels.AttentionFeatures(softcap=attrs["softcap"] is not None,
                                                       window=attrs["window"] is not None,
                                                       sinks=sinks is not None, blocks=blocks is not None,
                                                       alibi=alibi is not None, chunk=bool(attrs.get("chunk")))
        name = self.attention_kernels(q.dtype, features, [node])
        lines = [self.alloc(out)] + [self.late_caches[v.name] for v in node.outputs[1:] if v.name in self.late_caches]
        kernels = [name]
        keys = []
        for value, width, index in ((k, head_dim, 1), (v, v_dim, 2)):
            split = f"{self.var(value)}.reshape({batch}, {seq}, {kv_heads}, {width})"
            if len(node.outputs) == 3:
                cache = self.var(node.outputs[index])
                if self.cache_of.get(value.name) != cache:
                    store = self.store_kernel(value.dtype, [node])
                    kernels.append(store)
                    lines.append(f"launch_{store}({split}, {cache}[:, :, {cache}.shape[2] - {seq}:].transpose(1, 2))")
                keys.append(cache)
            else:
                keys.append(f"{split}.transpose(1, 2)")
        scale = head_dim ** -0.5 if attrs["scale"] is None else attrs["scale"]
        options = [f"window={attrs['window'] or 0}", f"softcap={float(attrs['softcap'] or 0.0)!r}"]
        if not attrs["causal"]:
            options.append("causal=False")
        if attrs.get("chunk"):
            options.append(f"chunk={attrs['chunk']}")
        query = f"{self.var(q)}.reshape({batch}, {seq}, {heads}, {head_dim})"
        operands = [repr(float(scale))]
        if sinks is not None:  # the kernels read them in q's type
            same = sinks.dtype == q.dtype
            operands.append(self.var(sinks) + ("" if same else f".to({torch_type(q.dtype)})"))
        if blocks is not None:  # block-diagonal (the packed images' frames, windows) or an image's causal opening
            operands.append(f"{self.var(blocks)}.to(torch.int64).contiguous()")
        if alibi is not None:  # the per-head slopes, f32
            operands.append(f"{self.var(alibi)}.to(torch.float32).contiguous()")
        lines.append(f"launch_{name}({query}, {keys[0]}, {keys[1]}, {self.var(out)}.view({batch}, {seq}, {heads}, "
                     f"{v_dim}), {self.var(mask)}, {', '.join(operands + options)})")
        self.step([node], lines, kernels=kernels)

    def attention_kernels(self, dtype: DType, features, nodes) -> str:
        """Register prefill, decode and combine kernels plus their launcher; returns the
        launcher's name (launch_<name>)."""
        tag = "mla" if features.mla else "attention"
        suffix = ("_softcap" if features.softcap else "") + ("_window" if features.window else "") \
            + ("_sinks" if features.sinks else "") + ("_blocks" if features.blocks else "") \
            + ("_alibi" if features.alibi else "") + ("_chunk" if features.chunk else "")
        prefill = self.use_kernel(f"{tag}_prefill{suffix}", lambda n: attention_kernels.attention_kernel(
            n, dtype, features, decode=False), nodes)
        decode = self.use_kernel(f"{tag}_decode{suffix}", lambda n: attention_kernels.attention_kernel(
            n, dtype, features, decode=True), nodes)
        combine = self.use_kernel("attention_combine", lambda n: attention_kernels.combine_kernel(n, dtype), nodes)
        if features.softcap:
            self.helpers.add("tanh_f32")
        name = f"{tag}{suffix}"
        self.launchers[name] = attention_kernels.attention_launcher(name, prefill, decode, combine, features.mla,
                                                                    features.sinks, features.blocks, features.alibi,
                                                                    features.chunk)
        return name

