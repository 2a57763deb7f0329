"""NPU plans of image encoders (ViT family, ``graph.meta["vision"]``): one ``image`` phase
(B images, no T or P), the patch projection planned as a GEMM, the attention cores
non-causal over the whole tokens x tokens square, totals per image; the tiled executor runs
every planned op and matches the reference and the plan's DMA bytes."""
import json
import re

import numpy as np
import pytest

from backends.npu.executor import execute, reference

from backends.npu.operands import random_operands
from frontends import load_spec
from irc.check import relative_error
from irc.npu.target import load_target, parse_target
from irc.testing import apply_pass
from passes.npu_tile.plan import dumps, machine_of, plan_graph

TINY_VISION = ["examples/tiny-clip-vit-large-patch14-336.yaml", "examples/tiny-dinov2-large.yaml",
               "examples/tiny-siglip-so400m-patch14-384.yaml"]
EDGE = "examples/targets/edge-npu.yaml"
# small enough that the tiny towers need many tiles, edge tiles and spills
MINI = {"target": {"name": "mini", "clock_mhz": 100, "sram": {"bytes": 6144},
                   "mac": {"rows": 4, "cols": 4, "dtypes": {"int8": {}, "fp32": {}}},
                   "dram": {"bytes_per_cycle": 4}, "dma": {"channels": 3}, "alignment_bytes": 8}}


def attention_nodes(graph):
    return {n.name: n.attrs for n in graph.nodes if n.op == "attention"}


@pytest.mark.parametrize("spec", TINY_VISION)
def test_one_image_phase_with_full_square_attention(spec):
    graph = load_spec(spec)
    vision = graph.meta["vision"]
    plan = plan_graph(graph, load_target(EDGE))
    assert plan["phases"] == {"image": {"B": 1}}
    assert plan["options"] == {"dtype": "int8", "accumulator": "int32", "batch": 1, "vision": vision}
    assert {r["phase"] for r in plan["ops"]} == {"image"}
    totals = plan["totals"]["image"]
    assert totals["images"] == 1 and totals["tokens"] == vision["tokens"]
    assert totals["seconds_per_image"] == totals["seconds"] > 0
    assert totals["images_per_second"] == pytest.approx(1 / totals["seconds"], rel=1e-3)   # seconds are rounded
    assert "seconds_per_token" not in totals and "tokens_per_second" not in totals
    assert totals["ratio"] >= 1 and all(r["ratio"] >= 1 for r in plan["ops"])
    tokens, nodes = vision["tokens"], attention_nodes(graph)
    cores = [r for r in plan["ops"] if r["kind"] == "attention"]
    assert len(cores) == len(nodes) > 0
    for record in cores:
        attrs = nodes[record["node"]]
        heads, head_dim = attrs["heads"], attrs["head_dim"]
        assert record["attention"]["causal"] is False and record["attention"]["past"] == 0
        assert record["shape"]["S"] == tokens and record["count"] * record["shape"]["M"] == heads * tokens
        assert record["macs"] == 2 * tokens * tokens * head_dim * heads   # the full square, scores and values
    # the patch projection is a planned GEMM [patches, C·p·p] x [C·p·p, d]
    patches = [r for r in plan["ops"] if r["op"] == "patch_embed"]
    assert len(patches) == 1
    shape, p = patches[0]["shape"], vision["patch"]
    assert (shape["M"], shape["K"]) == (vision["patches"], vision["channels"] * p * p)
    assert dumps(plan) == dumps(plan_graph(load_spec(spec), load_target(EDGE)))


def test_batch_scales_the_image_phase():
    graph = load_spec(TINY_VISION[0])
    plan = plan_graph(graph, load_target(EDGE), batch=3)
    assert plan["phases"] == {"image": {"B": 3}}
    totals = plan["totals"]["image"]
    assert totals["images"] == 3 and totals["seconds_per_image"] == round(totals["seconds"] / 3, 9)
    patches = next(r for r in plan["ops"] if r["op"] == "patch_embed")
    assert patches["shape"]["M"] == 3 * graph.meta["vision"]["patches"]


def test_lowered_patch_embed_plans_the_same_gemm():
    from passes.lower_patch_embed import LowerPatchEmbed

    graph = load_spec(TINY_VISION[1])
    lowered, _ = apply_pass(LowerPatchEmbed(), load_spec(TINY_VISION[1]))
    target = load_target(EDGE)
    direct = next(r for r in plan_graph(graph, target)["ops"] if r["op"] == "patch_embed")
    linears = [r for r in plan_graph(lowered, target)["ops"] if r["op"] == "linear"
               and r["shape"]["K"] == direct["shape"]["K"]]
    assert len(linears) == 1
    assert linears[0]["shape"] == direct["shape"] and linears[0]["dram"] == direct["dram"]


@pytest.mark.parametrize("spec", TINY_VISION)
@pytest.mark.parametrize("target,dtype", [("mini", "int8"), ("mini", "fp32"), (EDGE, "int8")])
def test_executor_matches_reference_and_planned_bytes(spec, target, dtype):
    machine_target = parse_target(MINI, "<mini>") if target == "mini" else load_target(target)
    plan = plan_graph(load_spec(spec), machine_target, dtype=dtype)
    machine = machine_of(plan)
    for record in plan["ops"]:
        operands, numbers = random_operands(record, machine, seed=2)
        if record["kind"] == "attention":
            assert operands["visible"].all()          # non-causal: every key visible to every query
        result = execute(record, machine, operands, numbers)
        expected = reference(record, machine, operands, numbers)
        assert result.dram == record["dram"], record["name"]
        assert result.sram_bytes == record["sram_bytes"] <= machine.sram_bytes
        if machine.is_float:
            assert relative_error(result.outputs, expected) <= 1e-6, record["name"]
        elif record["kind"] == "gemm":
            np.testing.assert_array_equal(result.outputs, expected, err_msg=record["name"])
        else:  # flash rescaling rounds differently from one softmax: at most one int8 step
            assert np.abs(result.outputs.astype(np.int64) - expected.astype(np.int64)).max() <= 1, record["name"]


def test_irc_tile_prints_the_image_phase(capsys, tmp_path):
    from irc_cli import main

    plan_path = tmp_path / "plan.json"
    args = ["tile", "examples/clip-vit-large-patch14-336.yaml", "--target-npu", EDGE, "-o", str(plan_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "time/image" in out and "time/token" not in out
    assert re.search(r"^\s+image\s+169 ", out, re.M)          # 24 layers x 7 + the patch projection
    assert re.search(r"images/s at batch 1 \(577 tokens an image\)", out)
    first = plan_path.read_bytes()
    plan = json.loads(first)
    assert list(plan["totals"]) == ["image"] and plan["totals"]["image"]["ratio"] >= 1
    core = next(r for r in plan["ops"] if r["kind"] == "attention")
    assert core["attention"]["causal"] is False and core["macs"] == 2 * 577 * 577 * 64 * 16
    assert main(args) == 0
    capsys.readouterr()
    assert plan_path.read_bytes() == first


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_image_attention_every_order_spills_and_edge_tiles(dtype):
    """The tiny CLIP tower's core (17 x 17, all keys visible) in 4 x 4 blocks: several query
    and key blocks, both loop orders (key-outer spills the softmax state), edge tiles."""
    import itertools

    from irc.npu import cost
    from passes.npu_tile import workloads
    from passes.npu_tile.plan import op_record

    machine = parse_target(MINI, "<mini>").machine(dtype)
    works, _ = workloads.extract(load_spec(TINY_VISION[0]), {"B": 1})
    work = next(w for w in works if w.kind == "attention")
    assert work.attention["causal"] is False and (work.shape.M, work.shape.S) == (17, 17)
    for order, db in itertools.product(cost.ATTENTION_ORDERS, (True, False)):
        record = op_record(work, "image", cost.choose(work.shape, machine, {"q": 4, "kv": 4}, order, db), machine)
        operands, numbers = random_operands(record, machine, seed=3)
        result = execute(record, machine, operands, numbers)
        expected = reference(record, machine, operands, numbers)
        assert result.dram == record["dram"]
        if order == ("kv", "q"):
            assert record["dram"]["o"] > record["shape"]["M"] * 8 * machine.out_bytes   # spilled state
        if machine.is_float:
            assert relative_error(result.outputs, expected) <= 1e-6
        else:
            assert np.abs(result.outputs.astype(np.int64) - expected.astype(np.int64)).max() <= 1
