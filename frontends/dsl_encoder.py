"""The DSL's encoder form (part of ``frontends.dsl.Model``): an embedding model's outputs.

    m = Model("tiny-embed", vocab=256, d_model=64, encoder=True)
    x = m.embed(m.input_ids())                     # input_ids, attention_mask [B, T]
    for layer in m.layers(2):
        x = x + layer.attention(layer.rms_norm(x), heads=4, rope=Rope(base=1e4), causal=False)
        x = x + layer.swiglu(layer.rms_norm(x), d_ff=160)
    h = m.last_hidden_state(m.rms_norm(x))         # output last_hidden_state [B, T, d]
    e = m.dense(m.pool(h, ("mean",)), 32, name="dense.0")
    m.sentence_embedding(m.l2_normalize(e))        # output sentence_embedding [B, 32]

An encoder graph (``Model(encoder=True)``, meta ``encoder: true``) has no KV cache, no
recurrent state and no logits: its inputs are ``input_ids`` and ``attention_mask``, both
[B, T]; the positions 0..T-1 of every row are computed in the graph (``range_like``), as
transformers' base models number them when given no ``position_ids``. RoPE is relative, so
a left-padded row's real tokens see the same scores as unpadded; the attention mask hides
the padding keys. Attention is bidirectional with ``causal=False`` (the caller's choice: a
causal encoder, last-token pooled, is an embedding model too).

Pooling follows sentence-transformers 6.2's ``Pooling`` for a padded batch (``pool``): the
modes' vectors concatenated in the order given, each [B, d], written with primitives every
target has:

- ``mean``: sum of the real tokens / max(count, 1e-9); ``mean_sqrt_len_tokens``: the sum /
  sqrt(max(count, 1e-9));
- ``max``: the largest real value per feature (padding set to float32's lowest, where
  sentence-transformers uses -inf: equal on every row with a real token);
- ``cls``: the first real token; ``lasttoken``: the last real token (zeros for a row with
  no real token, as sentence-transformers' masked gather gives; ``cls`` gives zeros there
  too, where sentence-transformers reads position 0);
- ``weightedmean``: real tokens weighted 1, 2, ... from the first real one, sum / max(sum of
  weights, 1e-9).

``dense`` is sentence-transformers' ``Dense`` (``linear`` with weight [out, in], optional
bias, identity or tanh after it); ``l2_normalize`` its ``Normalize`` (x / max(||x||₂,
1e-12), ``torch.nn.functional.normalize``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from frontends.dsl_args import positive

if TYPE_CHECKING:
    from frontends.dsl_core import Tensor

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
DENSE_ACTIVATIONS = (None, "tanh")
LOWEST = float(np.finfo(np.float32).min)


class EncoderOutputs:
    """Mixin of ``Model``: the outputs of an encoder graph (see the module docstring)."""

    def _encoder_only(self, what: str) -> None:
        if not self.encoder:
            raise self.error("encoder", f"{what} is an encoder's output", hint="build with Model(..., encoder=True)")

    def last_hidden_state(self, x: Tensor) -> Tensor:
        """Make ``x`` [B, T, d] the graph's first output, ``last_hidden_state``."""
        self._encoder_only("last_hidden_state")
        if self._graph.outputs:
            raise self.error("x", "last_hidden_state is already set")
        if len(x.shape) != 3:
            raise self.error("x", f"expected [B, T, d], got {x.value.type_str()}")
        self._drop_unused_positions()
        self._graph.rename(x.value, "last_hidden_state")
        self._graph.outputs = [x.value]
        return x

    def sentence_embedding(self, x: Tensor) -> Tensor:
        """Make ``x`` [B, n] the graph's second output, ``sentence_embedding``."""
        self._encoder_only("sentence_embedding")
        self._extra_output(x, "sentence_embedding")
        self.meta["sentence_embedding"] = x.shape[-1]
        return x

    def text_embeds(self, x: Tensor) -> Tensor:
        """Make ``x`` [B, n] the output ``text_embeds`` (a dual encoder's text tower: CLIP's
        ``get_text_features``)."""
        self._encoder_only("text_embeds")
        self._extra_output(x, "text_embeds")
        return x

    def pick_token(self, x: Tensor, ids: Optional[Tensor] = None, token: Optional[int] = None) -> Tensor:
        """x [B, T, d] -> [B, d] at one position of each row: without ``ids``, the last
        (SigLIP's text pooling); with them, the first holding ``token`` (CLIP's eos pooling),
        or with ``token`` None the first holding the row's largest id (CLIP's legacy rule);
        zeros for a row without it."""
        self._encoder_only("pick_token")
        c = self._pool_context()
        if ids is None:
            one = self.emit("constant", [], {"value": 1.0}, "pick_one")[0]
            return self._pick(x, self.emit("sub", [c["length"], one], None, "pick_last")[0], "pick_token")
        if token is None:
            target = self.emit("reduce_max", [ids], {"axes": [1], "keepdims": True}, "pick_largest_id")[0]
        else:
            target = self.emit("constant", [], {"value": int(token), "dtype": "i64"}, "pick_id")[0]
        hit = self.emit("cast", [self.emit("equal", [ids, target], None, "pick_hit")[0]], {"to": "f32"},
                        "pick_hit_f32")[0]
        from_end = self.emit("sub", [c["length"], c["index"]], None, "pick_from_end")[0]
        top = self.emit("reduce_max", [self.emit("mul", [hit, from_end], None, "pick_from_end_hit")[0]],
                        {"axes": [1], "keepdims": True}, "pick_first_from_end")[0]
        return self._pick(x, self.emit("sub", [c["length"], top], None, "pick_first")[0], "pick_token")

    def _extra_output(self, x: Tensor, name: str) -> None:
        """Make ``x`` [B, n] the output ``name`` after ``last_hidden_state`` (once)."""
        names = [v.name for v in self._graph.outputs]
        if names[:1] != ["last_hidden_state"] or name in names:
            raise self.error("x", f"call m.last_hidden_state(...) first, and {name} once")
        if len(x.shape) != 2:
            raise self.error("x", f"expected [B, n], got {x.value.type_str()}")
        self._graph.rename(x.value, name)
        self._graph.outputs.append(x.value)

    def pool(self, x: Tensor, modes: Sequence[str] = ("mean",)) -> Tensor:
        """[B, T, d] -> [B, len(modes)·d]: each pooling mode over the real tokens
        (``attention_mask``), concatenated in order (the module docstring)."""
        self._encoder_only("pool")
        modes = (modes,) if isinstance(modes, str) else tuple(modes)
        if not modes:
            raise self.error("modes", "give at least one pooling mode")
        for mode in modes:
            if mode not in POOLING_MODES:
                raise self.error("modes", f"unknown pooling mode {mode!r}", hint=f"one of {', '.join(POOLING_MODES)}")
        pooled = [getattr(self, "_pool_" + mode)(x) for mode in modes]
        if len(pooled) == 1:
            return pooled[0]
        return self.emit("concat", pooled, {"axis": -1}, "pooled")[0]

    def dense(self, x: Tensor, out_features: int, bias: bool = False, activation: Optional[str] = None,
              name: str = "dense.0") -> Tensor:
        """sentence-transformers' Dense: ``@{name}`` [out, in] (bias ``@{name}.bias``), then
        ``activation`` (None: identity, or "tanh")."""
        self._encoder_only("dense")
        positive("out_features", out_features, self.origin())
        if activation not in DENSE_ACTIVATIONS:
            raise self.error("activation", f"expected None (identity) or 'tanh', got {activation!r}")
        weight = self.param(name, (out_features, self._features(x)))
        b = self.param(f"{name}.bias", (out_features,)) if bias else None
        y = self.emit("linear", [x, weight, b], None, f"{name}_out")[0]
        return y if activation is None else self.emit(activation, [y], None, f"{name}_{activation}")[0]

    def l2_normalize(self, x: Tensor) -> Tensor:
        """x / max(||x||₂, 1e-12) over the last axis (sentence-transformers' Normalize)."""
        self._encoder_only("l2_normalize")
        square = self.emit("mul", [x, x], None, "embedding_square")[0]
        total = self.emit("reduce_sum", [square], {"axes": [-1], "keepdims": True}, "embedding_square_sum")[0]
        norm = self.emit("sqrt", [total], None, "embedding_norm")[0]
        floor = self.emit("constant", [], {"value": 1e-12}, "embedding_norm_floor")[0]
        norm = self.emit("maximum", [norm, floor], None, "embedding_norm_clamped")[0]
        return self.emit("div", [x, norm], None, "embedding_normalized")[0]

    # ---- the modes -----------------------------------------------------------------
    def _pool_context(self) -> dict:
        """The mask as f32 [B, T] and [B, T, 1], token indices [T] and T, made once."""
        if "keep" not in self._pooling:
            mask, _ = self._context()
            keep = self.emit("cast", [mask], {"to": "f32"}, "pool_keep")[0]
            index = self.emit("cast", [self.emit("range_like", [mask], {"axis": 1}, "pool_index_i64")[0]],
                              {"to": "f32"}, "pool_index")[0]
            length = self.emit("cast", [self.emit("dim_size", [mask], {"axis": 1}, "pool_length_i64")[0]],
                               {"to": "f32"}, "pool_length")[0]
            keep3 = self.emit("reshape", [keep], {"shape": list(keep.shape) + [1]}, "pool_keep3")[0]
            self._pooling.update(keep=keep, keep3=keep3, index=index, length=length)
        return self._pooling

    def _pool_sum(self, x: Tensor, weights3: Tensor, name: str) -> Tensor:
        """sum over T of x · weights3 [B, T, 1] -> [B, d]."""
        weighted = self.emit("mul", [x, weights3], None, f"{name}_weighted")[0]
        return self.emit("reduce_sum", [weighted], {"axes": [1], "keepdims": False}, f"{name}_sum")[0]

    def _pool_count(self) -> Tensor:
        """max(real tokens, 1e-9) [B, 1]."""
        c = self._pool_context()
        if "count" not in c:
            count = self.emit("reduce_sum", [c["keep"]], {"axes": [1], "keepdims": True}, "pool_count")[0]
            floor = self.emit("constant", [], {"value": 1e-9}, "pool_count_floor")[0]
            c["count"] = self.emit("maximum", [count, floor], None, "pool_count_clamped")[0]
        return c["count"]

    def _pool_mean(self, x: Tensor) -> Tensor:
        total = self._pool_sum(x, self._pool_context()["keep3"], "pool_mean")
        return self.emit("div", [total, self._pool_count()], None, "pool_mean")[0]

    def _pool_mean_sqrt_len_tokens(self, x: Tensor) -> Tensor:
        total = self._pool_sum(x, self._pool_context()["keep3"], "pool_mean_sqrt")
        root = self.emit("sqrt", [self._pool_count()], None, "pool_count_sqrt")[0]
        return self.emit("div", [total, root], None, "pool_mean_sqrt")[0]

    def _pool_max(self, x: Tensor) -> Tensor:
        real = self.emit("cast", [self._pool_context()["keep3"]], {"to": "bool"}, "pool_max_real")[0]
        lowest = self.emit("constant", [], {"value": LOWEST}, "pool_max_lowest")[0]
        masked = self.emit("where", [real, x, lowest], None, "pool_max_masked")[0]
        return self.emit("reduce_max", [masked], {"axes": [1], "keepdims": False}, "pool_max")[0]

    def _first_index(self) -> Tensor:
        """[B, 1]: the index of each row's first real token (T for a row without one):
        T - max over t of keep · (T - t)."""
        c = self._pool_context()
        if "first" not in c:
            from_end = self.emit("sub", [c["length"], c["index"]], None, "pool_from_end")[0]
            marked = self.emit("mul", [c["keep"], from_end], None, "pool_from_end_real")[0]
            top = self.emit("reduce_max", [marked], {"axes": [1], "keepdims": True}, "pool_first_from_end")[0]
            c["first"] = self.emit("sub", [c["length"], top], None, "pool_first")[0]
        return c["first"]

    def _pick(self, x: Tensor, at: Tensor, name: str) -> Tensor:
        """x [B, T, d] at token ``at`` [B, 1] of each row (zeros where no t equals it)."""
        c = self._pool_context()
        hit = self.emit("cast", [self.emit("equal", [c["index"], at], None, f"{name}_hit")[0]], {"to": "f32"},
                        f"{name}_one_hot")[0]
        hit3 = self.emit("reshape", [hit], {"shape": list(hit.shape) + [1]}, f"{name}_one_hot3")[0]
        return self._pool_sum(x, hit3, name)

    def _pool_cls(self, x: Tensor) -> Tensor:
        return self._pick(x, self._first_index(), "pool_cls")

    def _pool_lasttoken(self, x: Tensor) -> Tensor:
        c = self._pool_context()
        marked = self.emit("mul", [c["keep"], c["index"]], None, "pool_index_real")[0]
        last = self.emit("reduce_max", [marked], {"axes": [1], "keepdims": True}, "pool_last")[0]
        real = self.emit("mul", [x, c["keep3"]], None, "pool_last_real")[0]
        return self._pick(real, last, "pool_lasttoken")

    def _pool_weightedmean(self, x: Tensor) -> Tensor:
        c = self._pool_context()
        one = self.emit("constant", [], {"value": 1.0}, "pool_weight_one")[0]
        rank = self.emit("sub", [self.emit("add", [c["index"], one], None, "pool_rank_from_one")[0],
                                 self._first_index()], None, "pool_rank")[0]
        weights = self.emit("mul", [rank, c["keep"]], None, "pool_weights")[0]
        weights3 = self.emit("reshape", [weights], {"shape": list(weights.shape) + [1]}, "pool_weights3")[0]
        total = self._pool_sum(x, weights3, "pool_weightedmean")
        weight_sum = self.emit("reduce_sum", [weights], {"axes": [1], "keepdims": True}, "pool_weight_sum")[0]
        floor = self.emit("constant", [], {"value": 1e-9}, "pool_weight_floor")[0]
        weight_sum = self.emit("maximum", [weight_sum, floor], None, "pool_weight_sum_clamped")[0]
        return self.emit("div", [total, weight_sum], None, "pool_weightedmean")[0]
