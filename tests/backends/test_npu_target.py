"""NPU target descriptions: the shipped ones load; mistakes are SpecErrors at file:line:col
naming the key; an SRAM too small for one MAC-array tile or an unsupported dtype is a
clear error naming what does not fit."""
import glob

import pytest

from irc.npu.target import Target, load_target, smallest_tile
from irc.errors import BackendError, IRCError, SpecError

GOOD = """\
target:
  name: t
  clock_mhz: 500
  sram: {bytes: 65536}
  mac:
    rows: 8
    cols: 8
    dtypes:
      int8: {rate: 1.0, accumulator_bits: 32}
  dram: {bytes_per_cycle: 4}
"""


def write(tmp_path, text, name="t.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_shipped_targets_load_with_the_published_figures():
    targets = {t.name: t for t in map(load_target, sorted(glob.glob("examples/targets/*.yaml")))}
    assert set(targets) == {"edge-npu", "ethos-u55-256", "ethos-u65-512", "large-npu"}
    edge, u55, u65, large = (targets[n] for n in ("edge-npu", "ethos-u55-256", "ethos-u65-512", "large-npu"))
    assert (edge.sram_bytes, edge.mac_rows, edge.mac_cols, edge.support("int8").accumulator_bits) == (256 << 10, 16, 16, 32)
    assert u55.mac_rows * u55.mac_cols == 256 and u55.support("int16").rate == 0.5      # U55: 32..256 MACs
    assert u65.mac_rows * u65.mac_cols == 512 and u65.sram_bytes == 384 << 10          # U65: 256..512 MACs
    assert (large.sram_bytes, large.mac_rows, large.mac_cols) == (4 << 20, 64, 64)
    assert large.support("fp16") is not None and edge.support("fp16") is None
    for t in targets.values():
        assert Target.from_json(t.to_json()) == t


def test_defaults(tmp_path):
    t = load_target(write(tmp_path, GOOD))
    assert (t.sram_banks, t.dma_channels, t.dma_bytes_per_cycle, t.alignment_bytes, t.dram_latency_cycles) == (1, 1, 4, 1, 0)
    m = t.machine("int8")
    assert (m.op_bytes, m.acc_bytes, m.accumulator, m.k_align, m.peak_macs) == (1, 4, "int32", 1, 64)


@pytest.mark.parametrize("edit, where, message", [
    (("  dram: {bytes_per_cycle: 4}\n", "  dram: {bytes_per_cycle: 4}\n  alignment: 16\n"), ":11:3",
     "target.alignment: unknown key"),
    (("rows: 8", "rows: 0"), ":6:5", "target.mac.rows: expected a positive integer"),
    (("int8: {rate", "int4: {rate"), ":9:7", "target.mac.dtypes.int4: unknown key"),
    (("rate: 1.0", "rate: 2.0"), ":9:14", "target.mac.dtypes.int8.rate: expected a fraction"),
    (("accumulator_bits: 32", "accumulator_bits: 4"), ":9:25", "accumulator is narrower than int8"),
    (("sram: {bytes: 65536}", "sram: {bytes: 65536, banks: 3}"), ":4:24", "do not split into 3 equal banks"),
    (("  clock_mhz: 500\n", ""), ":1:1", "target.clock_mhz: missing required key"),
])
def test_mistakes_are_located(tmp_path, edit, where, message):
    path = write(tmp_path, GOOD.replace(*edit))
    with pytest.raises(SpecError) as err:
        load_target(path)
    assert str(err.value).startswith(path + where) and message in str(err.value)


def test_sram_smaller_than_one_mac_array_tile(tmp_path):
    path = write(tmp_path, GOOD.replace("bytes: 65536", "bytes: 512").replace("rows: 8", "rows: 16"))
    with pytest.raises(IRCError) as err:
        load_target(path)
    text = str(err.value)
    assert text.startswith(path + ":4:10") and "512 bytes cannot hold one 16x8x1 int8 tile" in text
    assert "A 16 + B 8 + C 512 bytes of int32 accumulators = 536 bytes" in text


def test_smallest_tile_counts_bursts_and_accumulators():
    m = load_target("examples/targets/edge-npu.yaml").machine("int8")
    assert smallest_tile(m) == {"a": 256, "b": 256, "c": 1024}


def test_unsupported_dtype_names_the_dtype_and_what_is_supported():
    with pytest.raises(BackendError, match="target edge-npu does not support fp16 operands .*takes int8"):
        load_target("examples/targets/edge-npu.yaml").machine("fp16")
