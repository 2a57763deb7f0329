"""The DSL's vision encoder form (part of ``frontends.dsl.Model`` and ``Layer``): a ViT.

    m = Model("tiny-vit", vocab=None, d_model=32, encoder=True)
    x = m.patch_embed(m.pixel_values(3, 32, 32), patch=8)        # [B, 16, 32]
    x = m.learned_tokens(x, "cls_token")                           # [B, 17, 32], CLS first
    x = m.learned_positions(x, "position_embeddings")              # + @position_embeddings [17, 32]
    for layer in m.layers(2):
        x = x + layer.attention(layer.layer_norm(x), heads=4, qkv_bias=True, out_bias=True, causal=False)
        x = x + layer.gelu_mlp(layer.layer_norm(x), d_ff=64, bias=True)
    h = m.last_hidden_state(m.layer_norm(x, "norm"))               # output last_hidden_state [B, 17, 32]
    m.pooler_output(m.token(h, 0))                                  # output pooler_output [B, 32]

A vision encoder (``Model(vocab=None, encoder=True)`` with ``pixel_values``) takes one input,
``pixel_values`` f32 [B, C, H, W] at a fixed image size, and attends over every token of an
image (no mask, no positions: its position embeddings are learned and added once). The
image becomes tokens through ``patch_embed`` (``irc.ops.vision``: the Conv2d with kernel =
stride = p of the checkpoints). Learned tokens are params [count, d], position embeddings
[tokens, d] (a checkpoint's [1, 1, d] or [1, N, d] is read as that). ``graph.meta["vision"]``
records channels, image size, patch, patches and tokens.

``build_vit(m, spec)`` builds a whole encoder from a ``VisionSpec`` (the HF frontend's ViT,
DINOv2, CLIP and SigLIP towers and the YAML form's ``vision:`` section go through it).

Layers add ``layer_scale`` (DINOv2's LayerScale: x times a learned [d] vector) and
``quick_gelu_mlp`` (CLIP's: up, x·sigmoid(1.702x), down, with biases, as primitives);
``attention_pool`` is SigLIP's pooling head (``frontends.dsl_attention_pool``: a learned probe
attending over the tokens with ``torch.nn.MultiheadAttention``'s packed in-projection, then
LayerNorm and a residual MLP).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from frontends.dsl_args import positive
from irc import dims
from irc.dtypes import DType
from irc.ops.vision import FEATURES  # a VLM decoder's input: the vision model's output, a row per visual token

if TYPE_CHECKING:
    from frontends.dsl_core import Tensor

PIXELS = "pixel_values"
ROWS = "image_rows"  # LLaVA-NeXT's vision model's second input: which feature rows an image is (packed_features)
IMAGE_ROWS = "I"
BIDIRECTIONAL = ("none", "image", "prefix")  # what an image opens in the causal mask (merge_image_features)  # its row count (all images' tokens; 0 on a step without an image)
QUICK_GELU = 1.702  # x * sigmoid(1.702 x), CLIP's quick_gelu


class VisionInputs:
    """Mixin of ``Model``: the vision encoder's input, tokens and outputs."""

    def _added_param(self, name: str, shape: tuple) -> Tensor:
        """A param the activations meet outside a linear (a token, a position, a scale), as
        float32 (activations are: a cast follows a param of another float type)."""
        from frontends.dsl_core import ACTIVATION, Tensor
        value = Tensor(self, self.param(name, tuple(shape)))
        if self.dtype == ACTIVATION:
            return value
        return self.emit("cast", [value], {"to": str(ACTIVATION)}, f"{name}_f32")[0]

    def _vision(self) -> dict:
        vision = self.meta.get("vision")
        if vision is None:
            raise self.error("x", "call m.pixel_values(...) first: this is a vision encoder's call")
        return vision

    def merge_image_features(self, x: Tensor, token: int, bidirectional=False, deepstack: int = 0) -> Tensor:
        """A VLM decoder's embeddings x [B, T, d] with each ``token`` placeholder's row
        replaced, in order, by the next row of the input ``image_features`` f32 [I, d]
        (``merge_tokens``; I = 0 on a step without an image). ``bidirectional`` (``BIDIRECTIONAL``),
        for every causal attention built after this call (the ``image_blocks`` of the ids,
        attention's ``blocks`` operand): "image" (or true), one image's tokens see each other
        (Gemma 3); "prefix", a chunk holding an image sees itself whole (PaliGemma).

        ``deepstack`` k (Qwen3-VL's DeepStack): each feature row is [(1 + k)·d], the token's
        features then k levels that later layers add; the merge runs on the embeddings widened
        by k·d zero columns (so the merged ``inputs_embeds`` are [B, T, (1 + k)·d], zeros where
        no image sits) and the first d columns are returned. ``deepstack_add(x, level)`` adds a
        level's columns after a layer."""
        from frontends.dsl_core import ACTIVATION, Tensor
        if self.encoder or self._ids is None:
            raise self.error("x", "image features merge into a decoder's token embeddings: call m.input_ids() first")
        if any(v.name == FEATURES for v in self._graph.inputs):
            raise self.error("x", "the image features are already merged")
        if not isinstance(token, int) or isinstance(token, bool) or token < 0:
            raise self.error("token", f"expected the image placeholder's token id, got {token!r}")
        width = self._features(x)
        if not isinstance(deepstack, int) or isinstance(deepstack, bool) or deepstack < 0:
            raise self.error("deepstack", f"expected a count of DeepStack levels, got {deepstack!r}")
        features = Tensor(self, self._graph.add_input(FEATURES, ACTIVATION, (IMAGE_ROWS, width * (1 + deepstack))))
        self.meta["image_token_id"] = token
        # how a prompt lays an image out (irc_cli.run_vlm): the placeholder widened to the image's
        # tokens, LLaVA's processor; a Hugging Face family sets its own (frontends.hf.vlm)
        self.meta["image_prompt"] = {"kind": "repeat", "placeholder": token, "before": [], "after": [], "around": ""}
        mode = {True: "image", False: "none"}.get(bidirectional, bidirectional)
        if mode not in BIDIRECTIONAL:
            raise self.error("bidirectional", f"expected one of {', '.join(BIDIRECTIONAL)}, got {bidirectional!r}")
        if mode != "none":
            self._blocks = self.emit("image_blocks", [self._ids], {"token": token, "prefix": mode == "prefix"},
                                     "image_blocks")[0]
        if not deepstack:
            return self.emit("merge_tokens", [x, self._ids, features], {"token": token}, "inputs_embeds")[0]
        zeros = self.emit("sub", [x, x], None, "deepstack_zeros")[0]  # from x alone: the embedding model reads ids only
        wide = self.emit("concat", [x] + [zeros] * deepstack, {"axis": -1}, "embeds_widened")[0]
        self._deepstack = self.emit("merge_tokens", [wide, self._ids, features], {"token": token}, "inputs_embeds")[0]
        self.meta["deepstack"] = deepstack
        return self.emit("slice", [self._deepstack], {"axis": -1, "start": 0, "end": width}, "token_embeds")[0]

    def deepstack_add(self, x: Tensor, level: int) -> Tensor:
        """x [B, T, d] plus DeepStack level ``level``'s columns of the merged embeddings (each
        image token's row of that level; zeros elsewhere, so text is unchanged); x itself where
        the model has no such level (``merge_image_features(deepstack=k)``)."""
        if self._deepstack is None or not 0 <= level < self.meta["deepstack"]:
            return x
        width = self._features(x)
        part = self.emit("slice", [self._deepstack], {"axis": -1, "start": width * (1 + level),
                                                      "end": width * (2 + level)}, f"deepstack_{level}")[0]
        return x + part

    def image_features(self, x: Tensor) -> Tensor:
        """Make ``x`` [N, tokens, d] a VLM vision model's output ``image_features``
        [N·tokens, d] (one row per visual token, images one after another: what the
        decoder's ``merge_image_features`` takes)."""
        self._vision()
        if self._graph.outputs:
            raise self.error("x", "a vision model's outputs are already declared")
        count, tokens, width = x.shape
        self.meta["vision"]["tokens"] = tokens
        rows = self.emit("reshape", [x], {"shape": [dims.mul(count, tokens), width]}, FEATURES)[0]
        self._graph.outputs.append(rows.value)
        return rows

    def packed_features(self, x: Tensor, newline: str = "image_newline") -> Tensor:
        """Make ``x`` [N, tokens, d] (every tile's projected tokens) the output
        ``image_features`` [I, d] as the rows the input ``image_rows`` i64 [I] picks from
        them, index N·tokens standing for ``@{newline}`` [d]: LLaVA-NeXT's any-resolution
        packing (the base view, then the tiles' grid unpadded with a newline after each row),
        which the processor lays out (``irc_cli.images_anyres.feature_rows``)."""
        from frontends.dsl_core import Tensor
        self._vision()
        if self._graph.outputs:
            raise self.error("x", "a vision model's outputs are already declared")
        count, tokens, width = x.shape
        flat = self.emit("reshape", [x], {"shape": [dims.mul(count, tokens), width]}, "tile_features")[0]
        row = self.emit("reshape", [self._added_param(newline, (width,))], {"shape": [1, width]}, "newline_row")[0]
        table = self.emit("concat", [flat, row], {"axis": 0}, "feature_table")[0]
        rows = Tensor(self, self._graph.add_input(ROWS, DType.i64, (IMAGE_ROWS,)))
        self.meta["vision"]["tokens"] = tokens  # per tile; an image's count follows its size
        out = self.emit("gather", [table, rows], {"axis": 0}, FEATURES)[0]
        self._graph.outputs.append(out.value)
        return out

    def mlp_projector(self, x: Tensor, width: int, approximate: str = "none", bias: bool = True) -> Tensor:
        """LLaVA's projector into a text model of ``width``: ``@projector.linear_1`` [width, d],
        GELU (``approximate`` "none" or "tanh"), ``@projector.linear_2`` [width, width] (biases
        ``.bias`` with ``bias``)."""
        self._vision()
        positive("width", width, self.origin())
        if approximate not in ("none", "tanh"):
            raise self.error("approximate", f"expected 'none' or 'tanh', got {approximate!r}")
        for i in (1, 2):
            weight = self.param(f"projector.linear_{i}", (width, self._features(x)))
            x = self.emit("linear", [x, weight, self.param(f"projector.linear_{i}.bias", (width,)) if bias else None],
                          None, f"projector_{i}")[0]
            if i == 1:
                x = self.emit("gelu", [x], {"approximate": approximate}, "projector_act")[0]
        return x

    def pool_tokens(self, x: Tensor, tokens: int) -> Tensor:
        """[B, n·n patches, d] -> [B, tokens, d]: the square patch grid average-pooled in k x k
        windows to a sqrt(tokens)-square grid, row by row (Gemma 3's AvgPool2d)."""
        vision = self._vision()
        side = vision["image_size"][0] // vision["patch"]
        per_side = math.isqrt(tokens) if isinstance(tokens, int) and tokens > 0 else 0
        if per_side * per_side != tokens or side % per_side or x.shape[1] != side * side:
            raise self.error("tokens", f"{tokens!r} tokens are not a square grid that divides the {side} x {side} "
                                       "patches")
        k, d = side // per_side, self._features(x)
        grid = self.emit("reshape", [x], {"shape": [x.shape[0], per_side, k, per_side, k, d]}, "patch_grid")[0]
        pooled = self.emit("reduce_mean", [grid], {"axes": [2, 4], "keepdims": False}, "pooled_grid")[0]
        return self.emit("reshape", [pooled], {"shape": [x.shape[0], tokens, d]}, "pooled")[0]

    def pixel_shuffle(self, x: Tensor, scale: int) -> Tensor:
        """[B, n·n, d] -> [B, n·n/s², s²·d]: each s x s block of the n x n patch grid becomes
        one token (Idefics3's connector, transformers' ``pixel_shuffle``: rows of s patches
        side by side, then s such rows)."""
        side = math.isqrt(x.shape[1]) if isinstance(x.shape[1], int) else 0
        if not isinstance(scale, int) or scale < 1 or side * side != x.shape[1] or side % scale:
            raise self.error("scale", f"{scale!r} does not divide the {side} x {side} patch grid "
                                      f"({x.shape[1]} tokens)")
        batch, d = x.shape[0], self._features(x)
        x = self.emit("reshape", [x], {"shape": [batch, side, side // scale, d * scale]}, "shuffle_rows")[0]
        x = self.emit("transpose", [x], {"perm": [0, 2, 1, 3]}, "shuffle_columns_first")[0]
        x = self.emit("reshape", [x], {"shape": [batch, side // scale, side // scale, d * scale * scale]},
                      "shuffle_blocks")[0]
        x = self.emit("transpose", [x], {"perm": [0, 2, 1, 3]}, "shuffle_rows_first")[0]
        return self.emit("reshape", [x], {"shape": [batch, (side // scale) ** 2, d * scale * scale]}, "shuffled")[0]

    def drop_tokens(self, x: Tensor, count: int = 1) -> Tensor:
        """x[:, count:]: the patch states without the first ``count`` (LLaVA's "default"
        feature strategy drops CLIP's class token)."""
        if not isinstance(count, int) or not 0 < count < x.shape[1]:
            raise self.error("count", f"expected 1 to {x.shape[1] - 1} tokens to drop, got {count!r}")
        return self.emit("slice", [x], {"axis": 1, "start": count, "end": x.shape[1]}, "patch_states")[0]

    def vision_model(self, vision) -> None:
        """Compile ``vision`` (a ``Model`` whose output is ``image_features``) beside this VLM
        decoder: ``graph.parts["vision"]``, its rows as wide as this model's embeddings."""
        graph = vision.graph
        outputs = [v.name for v in graph.outputs]
        if outputs != [FEATURES] or graph.outputs[0].shape[1] != self.d_model:
            raise self.error("vision", f"expected a vision model with the one output {FEATURES} [N, {self.d_model}], "
                                       f"got {', '.join(outputs) or 'no outputs'}")
        if not any(v.name == FEATURES for v in self._graph.inputs):
            raise self.error("vision", "call m.merge_image_features(...) first: the decoder takes the features")
        self._graph.parts["vision"] = graph

    def pixel_values(self, channels: int, height: int, width: int) -> Tensor:
        """The image batch ``pixel_values`` f32 [B, C, H, W] (the only input)."""
        from frontends.dsl_core import Tensor
        if not self.encoder or self.vocab is not None:
            raise self.error("pixel_values", "images are a vision encoder's input",
                             hint="build with Model(..., vocab=None, encoder=True)")
        if self.meta.get("vision") is not None:
            raise self.error("pixel_values", "the image input is already declared")
        where = self.origin()
        size = [positive(arg, value, where) for arg, value in (("channels", channels), ("height", height),
                                                              ("width", width))]
        self.meta["vision"] = {"channels": size[0], "image_size": size[1:], "patch": None, "patches": None,
                               "tokens": None}
        self.meta.pop("vocab_size", None)  # no vocabulary
        return Tensor(self, self._graph.add_input(PIXELS, DType.f32, ("B", *size)))

    def patch_embed(self, x: Tensor, patch: int, bias: bool = True, name: str = "patch_embed") -> Tensor:
        """[B, C, H, W] -> [B, (H/p)(W/p), d]: ``@{name}`` [d, C, p, p] (bias ``@{name}.bias``)."""
        vision = self._vision()
        positive("patch", patch, self.origin())
        height, width = vision["image_size"]
        if patch > min(height, width):
            raise self.error("patch", f"patch {patch} is larger than the image {height}x{width}")
        weight = self.param(name, (self.d_model, vision["channels"], patch, patch))
        b = self.param(f"{name}.bias", (self.d_model,)) if bias else None
        out = self.emit("patch_embed", [x, weight, b], {"patch": patch}, "patches")[0]
        vision.update(patch=patch, patches=out.shape[1], tokens=out.shape[1])
        return out

    def learned_tokens(self, x: Tensor, name: str, count: int = 1, at: int = 0) -> Tensor:
        """x [B, N, d] with the ``count`` tokens of ``@{name}`` [count, d] inserted before token
        ``at``: a class token (at 0), DINOv2's registers (at 1)."""
        d = self._features(x)
        positive("count", count, self.origin())
        tokens = x.shape[1]
        if not isinstance(at, int) or not 0 <= at <= tokens:
            raise self.error("at", f"expected a token index in 0..{tokens}, got {at!r}")
        row = self.emit("reshape", [self._added_param(name, (count, d))], {"shape": [1, count, d]}, f"{name}_row")[0]
        batch = self.emit("expand", [row], {"shape": [x.shape[0], count, d]}, f"{name}_batch")[0]
        parts = [batch, x] if at == 0 else [
            self.emit("slice", [x], {"axis": 1, "start": 0, "end": at}, f"{name}_before")[0], batch,
            self.emit("slice", [x], {"axis": 1, "start": at, "end": tokens}, f"{name}_after")[0]]
        out = self.emit("concat", parts, {"axis": 1}, "tokens")[0]
        self._vision()["tokens"] = out.shape[1]
        return out

    def learned_positions(self, x: Tensor, name: str) -> Tensor:
        """x [B, N, d] plus the learned position embedding ``@{name}`` [N, d]."""
        return self.emit("add", [x, self._added_param(name, tuple(x.shape[1:]))], None, "embeddings")[0]

    def token(self, x: Tensor, index: int, name: str = "pooled") -> Tensor:
        """x[:, index] [B, d] of x [B, N, d] (a class token's state)."""
        if not isinstance(index, int) or not 0 <= index < x.shape[1]:
            raise self.error("index", f"expected a token index below {x.shape[1]}, got {index!r}")
        picked = self.emit("slice", [x], {"axis": 1, "start": index, "end": index + 1}, f"{name}_token")[0]
        return self.emit("reshape", [picked], {"shape": [x.shape[0], x.shape[2]]}, name)[0]

    def pooler_output(self, x: Tensor) -> Tensor:
        """Make ``x`` [B, d] the graph's second output, ``pooler_output``."""
        self._vision()
        self._extra_output(x, "pooler_output")
        return x

    def image_embeds(self, x: Tensor) -> Tensor:
        """Make ``x`` [B, n] the output ``image_embeds`` (a dual encoder's projected image
        embedding, CLIP's ``get_image_features``), after ``pooler_output``."""
        self._vision()
        if [v.name for v in self._graph.outputs][1:2] != ["pooler_output"]:
            raise self.error("x", "call m.pooler_output(...) first: image_embeds projects it")
        self._extra_output(x, "image_embeds")
        return x

    def attention_pool(self, x: Tensor, heads: int, d_ff: int, eps: float, name: str = "head",
                       mask: Optional[Tensor] = None) -> Tensor:
        """SigLIP's pooling head, [B, N, d] -> [B, d] (``frontends.dsl_attention_pool``:
        a probe ``@{name}.probe`` attends over x, padding tokens of ``mask`` unread)."""
        from frontends.dsl_attention_pool import attention_pool
        return attention_pool(self, x, heads, d_ff, eps, name, mask)


class VisionLayer:
    """Mixin of ``Layer``: the vision encoders' layer parts (needs ``model`` and ``prefix``)."""

    def layer_scale(self, x: Tensor, name: str) -> Tensor:
        """x times ``@layers.{i}.{name}`` [d] (DINOv2's LayerScale)."""
        m = self.model
        return m.mul(x, m._added_param(f"{self.prefix}{name}", (m._features(x),)), f"{self.prefix}{name}_out")

    def quick_gelu_mlp(self, x: Tensor, d_ff: int) -> Tensor:
        """down(quick_gelu(up(x) + b_up)) + b_down, quick_gelu(u) = u·sigmoid(1.702u) (CLIP's),
        as primitives; weights ``mlp.w_up`` [d_ff, d], ``mlp.w_down``, biases ``mlp.b_up``, ``b_down``."""
        m, p = self.model, self.prefix
        w_up, w_down, b_up, b_down = self._up_down(x, d_ff, True)
        self._note_mlp("quick_gelu", d_ff)
        up = m.emit("linear", [x, w_up, b_up], None, f"{p}mlp_up")[0]
        gate = m.emit("sigmoid", [m.scale(up, QUICK_GELU, f"{p}mlp_up_scaled")], None, f"{p}mlp_gate")[0]
        act = m.emit("mul", [up, gate], None, f"{p}mlp_act")[0]
        return m.emit("linear", [act, w_down, b_down], None, f"{p}mlp_out")[0]


POOLERS = ("class_token", "class_token_norm", "dense_tanh", "attention", "none")
ACTIVATIONS = ("none", "tanh", "quick")  # GELU exact, GELU tanh, quick_gelu


@dataclass
class VisionSpec:
    """A ViT-family encoder, as feature flags: ``activation`` one of ``ACTIVATIONS``;
    ``pre_norm`` a LayerNorm after the embeddings (CLIP's pre_layrnorm); ``layer_scale``
    DINOv2's; ``final_norm`` the last_hidden_state normed (not CLIP's); ``pooler`` one of
    ``POOLERS``: the class token's state, it normed (CLIP's post_layernorm), a dense + tanh on it
    of ``pooler_width`` (ViT), SigLIP's attention-pooling head, or none."""
    image_size: int
    patch: int
    layers: int
    heads: int
    d_ff: int
    eps: float
    activation: str = "none"
    channels: int = 3
    patch_bias: bool = True
    class_token: bool = True
    registers: int = 0
    pre_norm: bool = False
    layer_scale: bool = False
    final_norm: bool = True
    pooler: str = "class_token"
    pooler_width: Optional[int] = None


def build_vit(m, spec: VisionSpec) -> Optional[Tensor]:
    """The encoder ``spec`` describes, built into ``m`` (``Model(vocab=None, encoder=True)``);
    returns ``pooler_output`` (None without a pooler), which a dual encoder projects:
    params ``patch_embed``, ``cls_token``, ``registers``, ``position_embeddings``, ``pre_norm``,
    ``layers.{i}.*`` (``attn_norm``, ``attn.*``, ``layer_scale1``, ``mlp_norm``, ``mlp.*``,
    ``layer_scale2``), ``norm``, ``post_norm``, ``pooler.dense``, ``head.*``."""
    if spec.pooler not in POOLERS:
        raise m.error("pooler", f"expected one of {', '.join(POOLERS)}, got {spec.pooler!r}")
    if spec.pooler.startswith("class_token") or spec.pooler == "dense_tanh":
        if not spec.class_token:
            raise m.error("pooler", f"pooler {spec.pooler} reads the class token, and there is none")
    if spec.registers and not spec.class_token:
        raise m.error("registers", "registers follow the class token, and there is none")
    x = hidden_states(m, spec)[-1]
    h = m.last_hidden_state(m.layer_norm(x, "norm", spec.eps) if spec.final_norm else x)
    if spec.pooler == "class_token":
        return m.pooler_output(m.token(h, 0))
    if spec.pooler == "class_token_norm":
        return m.pooler_output(m.layer_norm(m.token(h, 0), "post_norm", spec.eps))
    if spec.pooler == "dense_tanh":
        return m.pooler_output(m.dense(m.token(h, 0), spec.pooler_width or m.d_model, bias=True, activation="tanh",
                                       name="pooler.dense"))
    if spec.pooler == "attention":
        return m.pooler_output(m.attention_pool(h, spec.heads, spec.d_ff, spec.eps))
    return None


def hidden_states(m, spec: VisionSpec) -> list:
    """The encoder's hidden states as transformers lists them (``output_hidden_states``): the
    embeddings (after CLIP's pre-LayerNorm), then each layer's output; ``spec.layers`` layers
    are built (a VLM that reads hidden_states[k] builds k)."""
    if spec.activation not in ACTIVATIONS:
        raise m.error("activation", f"expected one of {', '.join(ACTIVATIONS)}, got {spec.activation!r}")
    x = m.patch_embed(m.pixel_values(spec.channels, spec.image_size, spec.image_size), spec.patch,
                      bias=spec.patch_bias)
    if spec.class_token:
        x = m.learned_tokens(x, "cls_token")
    x = m.learned_positions(x, "position_embeddings")
    if spec.registers:
        x = m.learned_tokens(x, "registers", spec.registers, at=1)
    if spec.pre_norm:
        x = m.layer_norm(x, "pre_norm", spec.eps)
    return [x] + vit_layers(m, x, spec)


def vit_layers(m, x: Tensor, spec: VisionSpec) -> list:
    """Each of ``spec.layers`` pre-norm layers' output after x: bidirectional attention with
    q/k/v and output biases (over the keys the model's attention mask leaves, where it has
    one: SigLIP 2's padding patches), the MLP of ``spec.activation``, DINOv2's LayerScale."""
    states = []
    for layer in m.layers(spec.layers):
        h = layer.attention(layer.layer_norm(x, eps=spec.eps), heads=spec.heads, qkv_bias=True, out_bias=True,
                            causal=False)
        x = x + (layer.layer_scale(h, "layer_scale1") if spec.layer_scale else h)
        h = layer.layer_norm(x, eps=spec.eps)
        h = layer.quick_gelu_mlp(h, spec.d_ff) if spec.activation == "quick" else layer.gelu_mlp(
            h, spec.d_ff, bias=True, approximate=spec.activation)
        x = x + (layer.layer_scale(h, "layer_scale2") if spec.layer_scale else h)
        states.append(x)
    return states


PROJECTORS = ("mlp", "linear", "soft_emb", "qformer")


@dataclass
class Features:
    """How a VLM's vision model turns the tower's states into image features, as flags:
    ``layers`` the hidden states read (transformers' ``hidden_states`` indices, -1 the last;
    several are concatenated along the features), ``drop`` leading tokens dropped (LLaVA's
    class token), ``post_norm`` the final LayerNorm ``@norm`` (SigLIP's post_layernorm),
    ``pool`` average-pooled to that many tokens (Gemma 3), ``shuffle`` pixel-shuffled by that
    scale (Idefics3), then the ``projector``: ``mlp`` (LLaVA: ``@projector.linear_1``, GELU
    ``approximate``, ``@projector.linear_2``, biases with ``bias``), ``linear`` (PaliGemma with a
    bias, Idefics3 without: ``@projector.proj``), ``soft_emb`` (Gemma 3: RMSNorm with 1 + w
    ``@projector.norm``, then ``@projector.proj``) or ``qformer`` (BLIP-2: the ``qformer`` spec's
    queries read the states, ``frontends.dsl_qformer`` under ``projector.``; ``@projector.proj``, biased)."""
    layers: tuple = (-1,)
    drop: int = 0
    post_norm: bool = False
    pool: Optional[int] = None
    shuffle: Optional[int] = None
    projector: str = "mlp"
    bias: bool = True
    approximate: str = "none"
    packed: bool = False  # LLaVA-NeXT: the tiles' rows picked by image_rows, a newline among them (packed_features)
    qformer: Optional[object] = None  # the projector "qformer"'s frontends.dsl_qformer.QFormerSpec


def build_image_features(m, spec: VisionSpec, features: Features, width: int) -> Tensor:
    """The vision model ``spec`` and ``features`` describe, built into ``m``, its output
    ``image_features`` [B·tokens, width] (``width``: the text model's)."""
    if features.projector not in PROJECTORS:
        raise m.error("projector", f"expected one of {', '.join(PROJECTORS)}, got {features.projector!r}")
    indices = [k if k >= 0 else spec.layers + 1 + k for k in features.layers]
    if not indices or any(not 0 <= k <= spec.layers for k in indices):
        raise m.error("layers", f"{list(features.layers)} are not hidden states of the {spec.layers}-layer tower",
                      hint=f"indices from {-(spec.layers + 1)} to {spec.layers}")
    spec = VisionSpec(**{**spec.__dict__, "layers": max(indices)})  # the layers after the last read go unbuilt
    states = hidden_states(m, spec)
    picked = [m.drop_tokens(states[k], features.drop) if features.drop else states[k] for k in indices]
    x = picked[0] if len(picked) == 1 else m.emit("concat", picked, {"axis": -1}, "feature_states")[0]
    if features.post_norm:
        x = m.layer_norm(x, "norm", spec.eps)
    if features.pool is not None:
        x = m.pool_tokens(x, features.pool)
    if features.shuffle is not None:
        x = m.pixel_shuffle(x, features.shuffle)
    if features.projector == "qformer":
        from frontends.dsl_qformer import build_qformer
        if features.qformer is None:
            raise m.error("projector", "the qformer projector needs its Q-Former's settings (Features.qformer)")
        x = build_qformer(m, x, features.qformer, prefix="projector.")
    if features.projector == "mlp":
        x = m.mlp_projector(x, width, features.approximate, features.bias)
    else:
        if features.projector == "soft_emb":
            x = m.rms_norm(x, "projector.norm", spec.eps, offset=1.0)
        biased = features.bias and features.projector in ("linear", "qformer")
        bias = m.param("projector.proj.bias", (width,)) if biased else None
        x = m.emit("linear", [x, m.param("projector.proj", (width, m._features(x))), bias], None, "projected")[0]
    return m.packed_features(x) if features.packed else m.image_features(x)
