"""Attention sinks (GPT-OSS) on the targets without a form for them: the Triton planner and
--target onnx-npu refuse them naming the node, and npu-tile leaves such attention unplanned
(counted in the unplanned traffic), never computing attention without its sinks."""
import pytest

from frontends.dsl import Model, Rope
from irc.errors import BackendError


def sinks_model():
    m = Model("tiny-sinks", vocab=64, d_model=32)
    x = m.embed(m.input_ids())
    for layer in m.layers(2):
        x = x + layer.attention(layer.rms_norm(x, "attn_norm"), heads=4, kv_heads=2, head_dim=8,
                                rope=Rope(base=1e4), sinks=True)
        x = x + layer.swiglu(layer.rms_norm(x, "mlp_norm"), d_ff=48)
    m.logits(m.rms_norm(x, "norm"))
    return m.graph


def test_triton_refuses_sinks(tmp_path):
    pytest.importorskip("torch")
    from backends.triton.emit import emit_module

    with pytest.raises(BackendError, match=r"layers\.0\.attn: the Triton target has no kernel for attention sinks"):
        emit_module(sinks_model(), str(tmp_path / "model.py"))


DSL = """from frontends.dsl import Model, Rope
m = Model("tiny-sinks", vocab=64, d_model=32)
x = m.embed(m.input_ids())
for layer in m.layers(2):
    x = x + layer.attention(layer.rms_norm(x, "attn_norm"), heads=4, kv_heads=2, head_dim=8, rope=Rope(base=1e4),
                            sinks=True)
    x = x + layer.swiglu(layer.rms_norm(x, "mlp_norm"), d_ff=48)
m.logits(m.rms_norm(x, "norm"))
model = m
"""


def test_onnx_npu_refuses_sinks(tmp_path, capsys):
    from irc_cli.commands import main

    spec = tmp_path / "sinks.py"
    spec.write_text(DSL)
    out = tmp_path / "npu"
    assert main(["compile", str(spec), "--target", "onnx-npu", "--precision", "f32", "-o", str(out)]) == 2
    assert "onnx-npu has no lowering for attention sinks" in capsys.readouterr().err
    assert not out.exists()


def test_npu_tile_leaves_sinks_unplanned():
    from irc.npu.target import load_target
    from passes.npu_tile.plan import plan_graph

    plan = plan_graph(sinks_model(), load_target("examples/targets/edge-npu.yaml"), tokens=8, past=8)
    assert not any("attn" in r.get("name", "") and r.get("op") == "attention" for r in plan["ops"])
    assert all(plan["totals"][phase]["unplanned"]["nodes"] > 0 for phase in plan["totals"])
