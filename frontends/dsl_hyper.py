"""Hyper-connections: a residual held as ``N`` parallel streams [B, T, N, d], mixed into and
out of each block by weights computed from the streams themselves. One mechanism, composed
of existing primitives (``linear``, ``sigmoid``, ``softmax``, reductions, elementwise
arithmetic), so every target that lowers those lowers it exactly.

Per block, with flat = streams reshaped [B, T, N·d] and r = rsqrt(mean(flat²) + eps_norm)
(a weightless RMS factor), mixes = (flat @ fn.T) · r:

- ``independent`` (Hunyuan-V4's ``HYV4HyperConnection``): fn [2N, N·d], base [2N], scale [2];
  pre = sigmoid(mixes[:N] · scale[0] + base[:N]) + eps, post = magnitude · sigmoid(
  mixes[N:] · scale[1] + base[N:]) + eps; the block reads Σ_n pre_n · streams_n, and the
  streams become post_n · block_out + streams_n.
- ``manifold`` (DeepSeek-V4's ``DeepseekV4HyperConnection``, mHC): fn [(2+N)·N, N·d],
  base [(2+N)·N], scale [3]; pre as above, post = 2 · sigmoid(...) (no eps), comb =
  softmax(mixes[2N:] viewed [N, N] · scale[2] + base) + eps, made doubly stochastic by
  ``sinkhorn_iters`` Sinkhorn-Knopp rounds (columns first, each sum + eps); the streams
  become post_n · block_out + Σ_j comb[j, n] · streams_j.

The head (``HyperHead``, both models): pre = sigmoid(mixes · scale + base) + eps with fn
[N, N·d], base [N], scale [1], and the model's hidden state is Σ_n pre_n · streams_n.

Everything is float32 (transformers keeps these modules in float32). The params are
``{prefix}fn``, ``{prefix}base`` and ``{prefix}scale``.

``GatedHyperConnections`` (Qwen4-Exp's ``Qwen4ExpTextGatedResidual``): n = each stream
RMS-normed over its d features times (1 + ``{prefix}hc_norm`` [N·d]), flat = n [B, T, N·d];
the block reads mean_n(sigmoid(silu(flat @ ``{prefix}down``.T / N) @ ``{prefix}up``.T)_n ·
n_n) (``down`` [R, N·d], ``up`` [N·d, R]), and the streams become streams_n + inject_n ·
block_out with inject = 2 · sigmoid(flat @ ``{prefix}inject``.T / N) (``inject`` [N, N·d]);
the head is the block input alone, with no inject.
"""
from __future__ import annotations

FORMS = ("independent", "manifold")


class HyperConnections:
    """The streams' arithmetic for one model ``m`` (``frontends.dsl.Model``): ``mult`` streams of
    width ``d``, the RMS factor's ``norm_eps`` and the gates' ``eps``."""

    def __init__(self, m, mult: int, d: int, norm_eps: float, eps: float, form: str = "independent",
                 magnitude: float = 2.0, sinkhorn_iters: int = 0):
        if form not in FORMS:
            raise m.error("form", f"hyper-connection forms: {', '.join(FORMS)}; got {form!r}")
        self.m, self.n, self.d, self.norm_eps, self.eps = m, mult, d, norm_eps, eps
        self.form, self.magnitude, self.iters = form, magnitude, sinkhorn_iters

    def _op(self, op: str, inputs, attrs, name: str):
        return self.m.emit(op, inputs, attrs, name)[0]

    def _const(self, value: float, name: str):
        return self._op("constant", [], {"value": float(value)}, name)

    def _cols(self, x, start: int, end: int, name: str, axis: int = -1):
        return self._op("slice", [x], {"axis": axis, "start": start, "end": end}, name)

    def widen(self, x, name: str = "streams"):
        """[B, T, d] -> [B, T, N, d]: every stream a copy of x."""
        batch, seq = x.shape[:2]
        x4 = self._op("reshape", [x], {"shape": [batch, seq, 1, self.d]}, f"{name}_one")
        return self._op("expand", [x4], {"shape": [batch, seq, self.n, self.d]}, name)

    def _mixes(self, streams, prefix: str, rows: int):
        """(flat @ fn.T) · rsqrt(mean(flat²) + norm_eps): [B, T, rows]."""
        batch, seq = streams.shape[:2]
        flat = self._op("reshape", [streams], {"shape": [batch, seq, self.n * self.d]}, f"{prefix}flat")
        square = self._op("mul", [flat, flat], None, f"{prefix}square")
        mean = self._op("reduce_mean", [square], {"axes": [-1], "keepdims": True}, f"{prefix}mean_square")
        inv = self._op("rsqrt", [self._op("add", [mean, self._const(self.norm_eps, f"{prefix}norm_eps")], None,
                                          f"{prefix}mean_square_eps")], None, f"{prefix}inv_rms")
        fn = self.m.param(f"{prefix}fn", (rows, self.n * self.d))
        return self._op("mul", [self._op("linear", [flat, fn], None, f"{prefix}projected"), inv], None,
                        f"{prefix}mixes")

    def _gate(self, logits, scale, base, prefix: str, role: str):
        """sigmoid(logits · scale + base)."""
        scaled = self._op("add", [self._op("mul", [logits, scale], None, f"{prefix}{role}_scaled"), base], None,
                          f"{prefix}{role}_logits")
        return self._op("sigmoid", [scaled], None, f"{prefix}{role}_sigmoid")

    def _collapse(self, streams, pre, prefix: str):
        """Σ_n pre_n · streams_n: [B, T, d]."""
        batch, seq = streams.shape[:2]
        pre4 = self._op("reshape", [pre], {"shape": [batch, seq, self.n, 1]}, f"{prefix}pre4")
        return self._op("reduce_sum", [self._op("mul", [pre4, streams], None, f"{prefix}weighted")],
                        {"axes": [2], "keepdims": False}, f"{prefix}collapsed")

    def enter(self, streams, prefix: str):
        """(state, block input [B, T, d]): the block's input and what ``leave`` needs."""
        n = self.n
        rows = 2 * n if self.form == "independent" else (2 + n) * n
        mixes = self._mixes(streams, prefix, rows)
        base, scale = self.m.param(f"{prefix}base", (rows,)), self.m.param(f"{prefix}scale", (2 if rows == 2 * n
                                                                                              else 3,))
        parts = {role: (self._cols(mixes, i * n, (i + 1) * n, f"{prefix}{role}_mix"),
                        self._cols(scale, i, i + 1, f"{prefix}{role}_scale", axis=0),
                        self._cols(base, i * n, (i + 1) * n, f"{prefix}{role}_base", axis=0))
                 for i, role in enumerate(("pre", "post"))}
        eps = self._const(self.eps, f"{prefix}eps")
        pre = self._op("add", [self._gate(*parts["pre"], prefix, "pre"), eps], None, f"{prefix}pre")
        post = self._gate(*parts["post"], prefix, "post")
        if self.form == "independent":
            post = self._op("add", [self._op("mul", [post, self._const(self.magnitude, f"{prefix}magnitude")], None,
                                             f"{prefix}post_magnified"), eps], None, f"{prefix}post")
            comb = None
        else:
            post = self._op("mul", [post, self._const(2.0, f"{prefix}two")], None, f"{prefix}post")
            comb = self._comb(mixes, base, scale, eps, prefix)
        return (post, comb, streams), self._collapse(streams, pre, prefix)

    def _comb(self, mixes, base, scale, eps, prefix: str):
        """DeepSeek-V4's doubly stochastic stream mix [B, T, N, N] (module docstring)."""
        n = self.n
        batch, seq = mixes.shape[:2]
        logits = self._op("reshape", [self._cols(mixes, 2 * n, (2 + n) * n, f"{prefix}comb_mix")],
                          {"shape": [batch, seq, n, n]}, f"{prefix}comb_mix4")
        comb_base = self._op("reshape", [self._cols(base, 2 * n, (2 + n) * n, f"{prefix}comb_base_flat", axis=0)],
                             {"shape": [n, n]}, f"{prefix}comb_base")
        scaled = self._op("add", [self._op("mul", [logits, self._cols(scale, 2, 3, f"{prefix}comb_scale", axis=0)],
                                           None, f"{prefix}comb_scaled"), comb_base], None, f"{prefix}comb_logits")
        comb = self._op("add", [self._op("softmax", [scaled], {"axis": -1}, f"{prefix}comb_softmax"), eps], None,
                        f"{prefix}comb0")
        axes = [-2] + [-1, -2] * (self.iters - 1)
        for k, axis in enumerate(axes):
            total = self._op("reduce_sum", [comb], {"axes": [axis], "keepdims": True}, f"{prefix}comb_sum{k}")
            comb = self._op("div", [comb, self._op("add", [total, eps], None, f"{prefix}comb_sum_eps{k}")], None,
                            f"{prefix}comb{k + 1}")
        return comb

    def leave(self, state, out, prefix: str):
        """The streams after the block: post_n · out + the residual (mixed by comb, manifold)."""
        post, comb, streams = state
        batch, seq = streams.shape[:2]
        post4 = self._op("reshape", [post], {"shape": [batch, seq, self.n, 1]}, f"{prefix}post4")
        out4 = self._op("reshape", [out], {"shape": [batch, seq, 1, self.d]}, f"{prefix}out4")
        residual = streams
        if comb is not None:  # Σ_j comb[j, n] · streams_j = comb.T @ streams
            comb_t = self._op("transpose", [comb], {"perm": [0, 1, 3, 2]}, f"{prefix}comb_t")
            residual = self._op("matmul", [comb_t, streams], None, f"{prefix}mixed_streams")
        return self._op("add", [self._op("mul", [post4, out4], None, f"{prefix}expanded"), residual], None,
                        f"{prefix}streams")

    def head(self, streams, prefix: str):
        """The final collapse (``HyperHead``): [B, T, d]."""
        mixes = self._mixes(streams, prefix, self.n)
        base, scale = self.m.param(f"{prefix}base", (self.n,)), self.m.param(f"{prefix}scale", (1,))
        pre = self._op("add", [self._gate(mixes, scale, base, prefix, "pre"), self._const(self.eps, f"{prefix}eps")],
                       None, f"{prefix}pre")
        return self._collapse(streams, pre, prefix)


class GatedHyperConnections(HyperConnections):
    """Qwen4-Exp's gated streams (module docstring): ``mult`` streams of width ``d``, the
    per-stream (1 + w) RMS norm's ``norm_eps``, the mixer's ``rank`` R."""

    def __init__(self, m, mult: int, d: int, norm_eps: float, rank: int):
        super().__init__(m, mult, d, norm_eps, 0.0)
        self.rank = rank

    def _normed(self, streams, prefix: str):
        """(normed [B, T, N, d], flat [B, T, N·d])."""
        batch, seq = streams.shape[:2]
        square = self._op("mul", [streams, streams], None, f"{prefix}square")
        mean = self._op("reduce_mean", [square], {"axes": [-1], "keepdims": True}, f"{prefix}mean_square")
        inv = self._op("rsqrt", [self._op("add", [mean, self._const(self.norm_eps, f"{prefix}norm_eps")], None,
                                          f"{prefix}mean_square_eps")], None, f"{prefix}inv_rms")
        weight = self._op("reshape", [self.m.param(f"{prefix}hc_norm", (self.n * self.d,))],
                          {"shape": [self.n, self.d]}, f"{prefix}hc_norm_nd")
        scale = self._op("add", [weight, self._const(1.0, f"{prefix}one")], None, f"{prefix}hc_norm_scale")
        normed = self._op("mul", [self._op("mul", [streams, inv], None, f"{prefix}rms"), scale], None,
                          f"{prefix}normed")
        return normed, self._op("reshape", [normed], {"shape": [batch, seq, self.n * self.d]}, f"{prefix}flat")

    def _over_n(self, x, prefix: str, role: str):
        return self._op("div", [x, self._const(float(self.n), f"{prefix}{role}_count")], None, f"{prefix}{role}_n")

    def _mixed(self, streams, prefix: str):
        """(the block input [B, T, d], flat)."""
        batch, seq = streams.shape[:2]
        normed, flat = self._normed(streams, prefix)
        down = self.m.param(f"{prefix}down", (self.rank, self.n * self.d))
        up = self.m.param(f"{prefix}up", (self.n * self.d, self.rank))
        low = self._op("silu", [self._over_n(self._op("linear", [flat, down], None, f"{prefix}down_out"), prefix,
                                             "down")], None, f"{prefix}down_silu")
        gate = self._op("sigmoid", [self._op("linear", [low, up], None, f"{prefix}up_out")], None, f"{prefix}gate")
        gate = self._op("reshape", [gate], {"shape": [batch, seq, self.n, self.d]}, f"{prefix}gate4")
        mixed = self._op("reduce_mean", [self._op("mul", [gate, normed], None, f"{prefix}gated")],
                         {"axes": [2], "keepdims": False}, f"{prefix}mixed")
        return mixed, flat

    def enter(self, streams, prefix: str):
        """(state, block input [B, T, d])."""
        mixed, flat = self._mixed(streams, prefix)
        inject = self._op("linear", [flat, self.m.param(f"{prefix}inject", (self.n, self.n * self.d))], None,
                          f"{prefix}inject_out")
        inject = self._op("mul", [self._op("sigmoid", [self._over_n(inject, prefix, "inject")], None,
                                           f"{prefix}inject_sigmoid"), self._const(2.0, f"{prefix}two")], None,
                          f"{prefix}post")
        return (inject, None, streams), mixed

    def head(self, streams, prefix: str):
        """The final mix (``hyper_connection_mixer``): [B, T, d]."""
        return self._mixed(streams, prefix)[0]
