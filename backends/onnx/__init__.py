"""The ONNX backend: ``irc compile SPEC --target onnx|onnx-ort -o model.onnx``.

Modules, one concern each:

- ``targets``: the two targets, their options and default pipelines (no onnx import, so
  the CLI can read it at start-up);
- ``builder``: the ONNX graph under construction (names, constants, weights, symbolic dims);
- ``portable``: standard ops for the primitives and the dense model ops;
- ``attention``: RoPE, masks and attention in standard ops; ``mla``: DeepSeek's MLA;
  ``moe``: mixture of experts (standard ops, or ORT's MoE op);
- ``quant``: quantized weights (DequantizeLinear, or MatMulNBits for onnx-ort) and the int8
  KV cache; ``moe_sorted``: routing, dispatch and grouped GEMMs of ``moe-sort``;
- ``ort``: the ONNX Runtime flavour (``com.microsoft`` ops where they fit);
- ``emit``: the main loop, the model's signature, weights and external data;
- ``genai``: ``genai_config.json`` for onnxruntime-genai;
- ``runtime``: running a compiled model (ORT sessions, left-padded batches, greedy decoding),
  for tests and benchmarks.

Entry point: ``backends.onnx.emit.emit_model(graph, path, target=..., opset=..., weights=...)``.
"""
