"""The Triton backend: a generated Python module of ``@triton.jit`` kernels plus a launcher.

``backends.triton.emit.emit_module(graph, path)`` writes ``path`` (the module) and its
weights (``.pt``, same stem). Kernel source text is generated from the graph by the
modules in ``backends.triton.kernels`` (one per kernel family); ``backends.triton.plan``
decides which graph nodes each kernel implements (fusion) and which run as torch ops.

What the target takes (after ``DEFAULT_PIPELINE``):

==========================================  ==============================================
graph ops                                   in the emitted module
==========================================  ==============================================
linear, dequant_linear (+ bias, + the       matmul kernel (grouped order, autotuned), the
elementwise chain after it)                 chain in its epilogue; int8/int4 decoded in
                                            the K loop
swiglu, geglu, mul(act(linear), linear)     dual matmul, GLU epilogue (+ down matmul)
gelu_mlp                                    two matmuls (bias, gelu epilogue)
rms_norm, layer_norm, elementwise ops,      fused row kernels (residual add + norm, ...;
embedding                                   a 0-d constant operand broadcast: relu²)
rope                                        rope kernel, in place / into the KV cache
attention                                   flash attention: prefill, split-KV decode;
                                            sinks (GPT-OSS) seed the online softmax
mla_absorbed_attention                      matmuls, row and rope kernels, MLA attention
                                            over the latent cache
mla_latent_attention                        the same, plus the per-head GEMM (W^UK into
                                            the latent query, W^UV after attention)
grouped_gemm (+ gather, act/mul, weighted   MoE grouped GEMMs (GLU; down + scatter-add)
scatter_add)
dequantize read as a GEMM weight            folded into that GEMM
reshape, gather, scatter_add, moe_route,    torch ops (listed in the module docstring)
moe_dispatch, topk, dequantize, ...
causal_conv1d, gated_rms_norm               conv kernel (prefill and decode, state in and
                                            out); gated group-norm kernel
selective_scan (Mamba-1)                    sequential scan kernel (decay per channel and
                                            state index: no chunked matmul form)
ssd (Mamba-2), gated_delta_rule             step kernel for decode (T = 1) and unchunked
                                            prefills; with the ``chunk`` attribute
                                            (scan-chunk pass) chunked prefill kernels:
                                            SSD chunk-state, state-passing, chunk-scan;
                                            delta rule triangular solve + chunk scan
                                            (per-head decay; per-channel: step kernel).
                                            States are graph inputs/outputs
                                            (``backends.triton.plan_ssm``)
patch_embed (a ViT's patch projection)      lowered by lower-patch-embed: reshape and
                                            transpose torch ops, then the matmul kernel
all_reduce, all_gather, vocab_embedding     torch.distributed calls (a sharded graph: one
(shard{tp=N})                               process a rank, one weights file a rank;
                                            ``backends.triton.collective``)
mla_attention, moe, patch_embed             refused: run mla-absorb / moe-sort /
                                            lower-patch-embed first (a moe with experts
                                            split across ranks, shard{ep=N}: refused)
==========================================  ==============================================

Importing this package imports neither torch nor triton; only emitting (and running the
emitted module) needs them: ``pip install -e .[triton]``.
"""

# The triton target's default pipeline: MLA and dense MoE are lowered to the forms the
# kernels take (absorbed MLA over the latent cache; sorted MoE with grouped GEMMs), and a
# ViT's patch_embed to the patches (torch reshapes) and a linear (the matmul kernel).
DEFAULT_PIPELINE = "dce,cse,mla-absorb,moe-sort,lower-patch-embed"
