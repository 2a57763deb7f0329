"""``irc tile`` end to end (through ``irc_cli.main``): plan.json and the HTML report, byte-identical reruns, one clear message and exit
code 2 for bad input, and no partial output file."""
import json
import re

from irc_cli import main

TINY = "examples/tiny-llama3.yaml"
EDGE = "examples/targets/edge-npu.yaml"


def run(capsys, *argv):
    code = main(["tile", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_and_report(capsys, tmp_path):
    plan_path, report_path = tmp_path / "plan.json", tmp_path / "plan.html"
    code, out, err = run(capsys, TINY, "--target-npu", EDGE, "--tokens", "32", "--past", "64", "-o", str(plan_path),
                         "--report", str(report_path))
    assert code == 0 and "wrote" in err
    assert re.search(r"prefill\s+15 ", out) and re.search(r"decode\s+15 ", out)
    plan = json.loads(plan_path.read_text())
    assert plan["phases"]["prefill"]["T"] == 32 and plan["phases"]["decode"]["P"] == 64
    html = report_path.read_text()
    assert html.count("<svg") == 4 and "SRAM occupancy" in html and "DRAM traffic per layer" in html
    assert "layers.0.mlp_out:gate_up" in html
    assert '<section id="npu">' in html and "Target <b>edge-npu</b>:" in html      # the report's NPU section
    assert "<td class='l'>layers.0.x</td>" in html and "m&gt;n&gt;k" in html       # fused ops and loop orders
    for fetch in ("http:", "https:", "src=", "<script", "<link", "@import", "url("):
        assert fetch not in html


def test_reruns_are_byte_identical(capsys, tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    for path in (first, second):
        assert run(capsys, "examples/tiny-deepseek-v2.yaml", "--target-npu", EDGE, "--passes", "mla-absorb",
                   "-o", str(path), "--report", str(path.with_suffix(".html")))[0] == 0
    assert first.read_bytes() == second.read_bytes()
    assert first.with_suffix(".html").read_bytes() == second.with_suffix(".html").read_bytes()
    assert any(r["op"] == "mla_latent_attention" for r in json.loads(first.read_text())["ops"])


def test_bad_target_file_is_one_located_message(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(open(EDGE).read().replace("rows: 16", "rows: sixteen"))
    out_path = tmp_path / "plan.json"
    code, out, err = run(capsys, TINY, "--target-npu", str(bad), "-o", str(out_path))
    assert code == 2 and f"{bad}:" in err and "target.mac.rows: expected a positive integer" in err
    assert "Traceback" not in err and not out_path.exists()


def test_unsupported_dtype_and_bad_numbers(capsys, tmp_path):
    code, _, err = run(capsys, TINY, "--target-npu", EDGE, "--dtype", "fp16")
    assert code == 2 and "does not support fp16 operands" in err
    code, _, err = run(capsys, TINY, "--target-npu", EDGE, "--past", "-1")
    assert code == 2 and "past must be an integer >= 0" in err
