"""The onnx-npu target: static-shape ONNX graphs for edge NPUs (``--target onnx-npu``).

Modules, one concern each:

- ``targets``: the options (``--chunk``, ``--precision``, ``--calibration``), their checks and
  the default pipeline (no onnx import);
- ``lower``: the static-shape op table (gathered RoPE tables, attention over a fixed cache
  with an additive mask, new KV entries as outputs, dense MoE); ``mla``: un-absorbed MLA;
- ``emit``: the folder: ``chunk.onnx`` and ``decode.onnx`` over one ``model.data``, and
  ``irc_npu.json``; ``vision``: an image encoder's folder (one ``vision.onnx``);
- ``qdq``: W8A16 / W4A16 QDQ placement from calibrated ranges;
- ``host``: the host loop (chunked prefill, decode, the fixed-size cache) on ONNX Runtime;
- ``qnn``: ahead-of-time compiles with onnxruntime-qnn's HTP backend and their placement;
- ``placement``: the per-layer placement report.
"""
