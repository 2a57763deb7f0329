"""build_report over real pipeline runs: sections, pass names, provenance links, the
seed's FLOP accounting, self-containment, size and byte-identical output."""
from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from frontends import load_spec
from irc.errors import IRCError
from irc.report import build_report, load_steps
from irc.report import model

from report_runs import BIG_PIPELINE, ROOT, TINY_PIPELINE, run_pipeline


@pytest.fixture(scope="module")
def tiny_html(tiny_run) -> str:
    return build_report(tiny_run.dump_dir, tiny_run.graph, input_graph=tiny_run.input_graph,
                        records=tiny_run.manager.records, passes=tiny_run.manager.passes)


def test_sections_and_every_pass_are_there(tiny_html):
    for section in ("pipeline", "passes", "model", "sources"):
        assert f'<section id="{section}">' in tiny_html
    for name in TINY_PIPELINE.split(","):
        assert f">{name}</a>" in tiny_html or f">{name}<" in tiny_html
    assert 'id="npu"' not in tiny_html                       # no plan, no section
    for heading in ("One transformer block", "Parameters by component", "KV cache against context",
                    "FLOPs per token against context"):
        assert heading in tiny_html


def test_timeline_rows_carry_time_change_check_and_deltas(tiny_run, tiny_html):
    table = tiny_html[tiny_html.index("<table class='num pipeline'>"):]
    table = table[:table.index("</table>")]
    rows = re.findall(r"<tr class='(\w+)'>(.*?)</tr>", table)
    assert [cls for cls, _ in rows][0] == "input" and len(rows) == len(TINY_PIPELINE.split(",")) + 1
    absorb = rows[1][1]
    record = tiny_run.manager.records[0]
    assert f"{record.seconds * 1000:.1f} ms" in absorb
    assert f"{record.check_error:.2e}" in absorb
    assert "changed" in absorb and "−1.06 KiB" in absorb      # the KV cache shrinks: 1,280 -> 192 bytes/token


def test_changed_passes_show_regions_pictures_and_the_rule(tiny_html):
    article = tiny_html[tiny_html.index('<article class="pass" id="pass-01">'):]
    article = article[:article.index("</article>")]
    assert "rewritten by <b>mla-absorb</b>" in article
    assert "mla_latent_attention" in article and "<pre class='diff'>" in article
    assert article.count('<svg class="graph"') >= 2          # before and after
    assert "before (00" in article and "after (01" in article


def test_the_mla_trade_is_tabled(tiny_html):
    """Both absorbed forms (and the un-absorbed one), their numbers and the roofline pick."""
    section = tiny_html[tiny_html.index('<h3 id="mla">'):]
    section = section[:section.index("</table>", section.index("Decode roofline"))]
    assert "runtime (compiled)" in section and "folded" in section and "un-absorbed" in section
    assert "FLOPs/token @ 4,096" in section and "bytes read/token @ 32,768" in section
    assert "NVIDIA H100 SXM" in section and section.count("<tr>") == 1 + 3 + 1 + 8


def test_nodes_link_to_their_spec_lines(tiny_html):
    anchors = set(re.findall(r'id="(src\d+-L\d+)"', tiny_html))
    links = re.findall(r'href="#(src\d+-L\d+)"', tiny_html)
    assert links and set(links) <= anchors
    assert "tiny-deepseek-v2.yaml" in tiny_html
    # a lowered node inherits the origin of the node it replaced and names the pass
    assert re.search(r"layers\.0\.mlp_out\.gate · from [^ ]*tiny-deepseek-v2\.yaml:\d+ · introduced by 03 lower-mlp",
                     tiny_html.replace("&quot;", '"'))


def test_self_contained(tiny_html):
    assert "<script" not in tiny_html
    assert not re.search(r"""(src|href)=["'](https?:)?//""", tiny_html)
    assert "http://" not in tiny_html and "https://" not in tiny_html
    assert "@import" not in tiny_html and "url(http" not in tiny_html


def test_byte_identical_for_the_same_input(tiny_run, tiny_html, tmp_path):
    again = build_report(tiny_run.dump_dir, tiny_run.graph, input_graph=tiny_run.input_graph,
                         records=tiny_run.manager.records, passes=tiny_run.manager.passes)
    assert again == tiny_html
    # two runs differ only in their pass times: without them the reports are the same bytes
    other = run_pipeline(tiny_run.spec, TINY_PIPELINE, tmp_path / "again", check=True)
    first, second = (build_report(r.dump_dir, r.graph, input_graph=r.input_graph, records=r.manager.records,
                                  passes=r.manager.passes, times=False) for r in (tiny_run, other))
    assert first == second


def test_from_the_dump_directory_alone(tiny_run, tmp_path):
    html = build_report(tiny_run.dump_dir)
    assert '<section id="model">' in html and "mla-absorb" in html
    assert "no pass times" in html                           # the stats lines hold none
    assert "give <code>irc report --spec SPEC</code>" in html
    # a stats line that carries seconds and notes is read
    copy = tmp_path / "dump"
    shutil.copytree(tiny_run.dump_dir, copy)
    stats = copy / "01-mla-absorb.stats.json"
    line = json.loads(stats.read_text())
    stats.write_text(json.dumps({**line, "seconds": 0.25, "notes": ["mla-absorb: a note"]}) + "\n")
    steps = load_steps(str(copy))
    assert steps[1].seconds == 0.25 and steps[1].notes == ["mla-absorb: a note"]
    html = build_report(str(copy))
    assert "250.0 ms" in html and "mla-absorb: a note" in html


def test_stale_dumps_are_refused_or_ignored(tiny_run, tmp_path):
    copy = tmp_path / "dump"
    shutil.copytree(tiny_run.dump_dir, copy)
    shutil.copy(copy / "02-lower-norms.ir", copy / "02-rope-fuse.ir")
    with pytest.raises(IRCError, match="holds 2 dumps for step 02"):
        load_steps(str(copy))
    steps = load_steps(str(copy), tiny_run.manager.records)   # the records say which one this run wrote
    assert [s.name for s in steps][:3] == ["input", "mla-absorb", "lower-norms"]
    os.remove(copy / "03-lower-mlp.ir")
    with pytest.raises(IRCError, match="lacks step 03"):
        load_steps(str(copy), tiny_run.manager.records)
    with pytest.raises(IRCError, match="no such dump directory"):
        load_steps(str(tmp_path / "missing"))


def test_attention_share_matches_the_seed_for_llama3_8b():
    graph = load_spec(str(ROOT / "examples/llama3-8b.yaml"))
    summary = model.analyze(graph, 4096)
    contexts = model.CONTEXTS
    curves = model.flop_curves(graph, summary, contexts)
    train = dict(zip(contexts, curves["train_share"]))
    assert train[4096] == pytest.approx(0.0627, abs=0.001)    # seed §5: ~6%
    assert train[131072] == pytest.approx(0.681, abs=0.002)   # seed §5: ~68%
    assert curves["train"][contexts.index(4096)] == pytest.approx(51.4e9, rel=0.01)
    forward = dict(zip(contexts, curves["forward"]))
    assert forward[4096] == summary["flops_per_token"]          # the same number irc show prints
    assert curves["forward_fixed"] == 2 * (8_030_261_248 - 128_256 * 4096 - 65 * 4096)  # all but embedding, norms
    assert dict(zip(contexts, curves["forward_share"]))[4096] == pytest.approx(0.125, abs=0.001)


def test_kv_alternatives_for_llama3_8b():
    graph = load_spec(str(ROOT / "examples/llama3-8b.yaml"))
    curves = {label: values for label, values, _ in model.kv_curves(graph, graph, (4096,))}
    assert curves["as compiled (bf16)"] == [512 * 2**20]        # 32 layers x 2 x 8 x 128 x 2 bytes x 4,096
    assert curves["MHA, 32 KV heads"] == [2 * 2**30]
    assert curves["GQA, 8 KV heads (this model)"] == [512 * 2**20]
    assert curves["int8 cache of the compiled layout (+f32 scale per row)"] == [32 * 2 * 8 * (128 + 4) * 4096]


def test_full_size_llama3_8b_report_is_small(big_run):
    html = build_report(big_run.dump_dir, big_run.graph, input_graph=big_run.input_graph,
                        records=big_run.manager.records, passes=big_run.manager.passes)
    assert len(html.encode()) < 5 * 2**20
    assert len(big_run.graph.nodes) > 1000
    assert "one box per layer (2,162 nodes)" in html or "one box per layer (" in html
    for name in BIG_PIPELINE.split(","):
        assert name in html
    assert "layers 0–31: 32 regions alike up to names" in html


def test_a_graph_without_layers_or_attention(tmp_path):
    """A hand-built graph (no attention op, no cache): the model section says what it lacks."""
    from irc.analysis import stats_line
    from irc.passmanager import PassManager, parse_pipeline
    from irc.build import emit1
    from irc.dtypes import DType
    from irc.graph import Graph

    g = Graph("plain")
    x = g.add_input("x", DType.f32, ("B", "T", 8))
    h = emit1(g, "linear", [x, g.add_param("w", DType.f32, (8, 8))], name="h")
    g.outputs = [emit1(g, "add", [h, x], name="y")]
    manager = PassManager(parse_pipeline("lower-linear,dce"), dump_dir=str(tmp_path), stats=stats_line)
    manager.run(g)
    html = build_report(str(tmp_path), g, records=manager.records)
    assert "there is no block to draw" in html and '<section id="model">' in html
