"""NPU target descriptions: YAML in, a checked ``Target`` out.

A target file has one top-level key, ``target`` (defaults in brackets)::

    target:
      name: edge-npu                 # required
      summary: "..."                 # one line for reports [""]
      clock_mhz: 800                 # required
      sram: {bytes: 262144, banks: 1}          # bytes required; banks [1]
      mac:
        rows: 16                     # required: output rows per cycle (the M side)
        cols: 16                     # required: output columns per cycle (the N side)
        dtypes:                      # required: operand dtypes the array multiplies
          int8: {rate: 1.0, accumulator_bits: 32}
                                     # rate: fraction of rows x cols MACs per cycle [1.0];
                                     # accumulator_bits: partial-sum width [32]
      dram: {bytes_per_cycle: 8, latency_cycles: 0}   # bytes_per_cycle required; latency [0]
      dma: {channels: 2, bytes_per_cycle: 8}          # channels [1]; per-channel rate [DRAM's]
      alignment_bytes: 16            # DMA burst: rows move in whole bursts [1]

Operand dtypes are ``int8``, ``int16``, ``fp16``, ``bf16`` and ``fp32``. Accumulators are
stored in SRAM at the next power-of-two byte width (a 40-bit accumulator takes 8 bytes).

What the numbers mean to the model (``irc.npu.cost``): the MAC array computes a
``rows x cols`` block of outputs per cycle, one reduction step per cycle, at ``rate``
times that for the dtype; tiles are multiples of ``rows`` (M), ``cols`` (N) and the
burst (K, ``alignment_bytes`` / operand bytes). DMA moves a row of a tile in whole
bursts, spreading a step's transfers over its channels: bytes move at the DRAM rate, or
at channels x channel rate when that is lower. Banks are recorded and reported; the model
treats the SRAM as one address space (bank conflicts are not modelled).

Every mistake is a ``SpecError`` at the file:line:column of the offending key, including
an SRAM too small for one MAC-array tile of some dtype (the error names the dtype and
what does not fit).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Optional

from irc.errors import BackendError, SpecError
from irc import yamlloc
from irc.yamlloc import Fields, non_negative_int, positive_int, positive_number, string

# operand dtype -> (bytes, is_float)
DTYPES = {"int8": (1, False), "int16": (2, False), "fp16": (2, True), "bf16": (2, True), "fp32": (4, True)}


def ceil_div(a, b):
    return -(-a // b)


def round_up(a, b):
    return ceil_div(a, b) * b


@dataclass(frozen=True)
class DTypeSupport:
    rate: float
    accumulator_bits: int


@dataclass(frozen=True)
class Target:
    name: str
    summary: str
    clock_mhz: float
    sram_bytes: int
    sram_banks: int
    mac_rows: int
    mac_cols: int
    dtypes: tuple          # ((dtype name, DTypeSupport), ...) in file order
    dram_bytes_per_cycle: float
    dram_latency_cycles: int
    dma_channels: int
    dma_bytes_per_cycle: float
    alignment_bytes: int

    def support(self, dtype: str) -> Optional[DTypeSupport]:
        return dict(self.dtypes).get(dtype)

    def machine(self, dtype: str) -> "Machine":
        """The numbers the cost model uses for operands of ``dtype``; a BackendError when
        the MAC array does not multiply that dtype."""
        support = self.support(dtype)
        if support is None:
            known = ", ".join(name for name, _ in self.dtypes)
            raise BackendError(f"target {self.name} does not support {dtype} operands (its MAC array takes {known})",
                               hint="choose one of those with --dtype, or describe a target that has it")
        return make_machine(self, dtype, support)

    def to_json(self) -> dict:
        """The target as plain data (the ``target`` section of a plan)."""
        return {
            "name": self.name, "summary": self.summary, "clock_mhz": self.clock_mhz,
            "sram": {"bytes": self.sram_bytes, "banks": self.sram_banks},
            "mac": {"rows": self.mac_rows, "cols": self.mac_cols,
                    "dtypes": {name: asdict(s) for name, s in self.dtypes}},
            "dram": {"bytes_per_cycle": self.dram_bytes_per_cycle, "latency_cycles": self.dram_latency_cycles},
            "dma": {"channels": self.dma_channels, "bytes_per_cycle": self.dma_bytes_per_cycle},
            "alignment_bytes": self.alignment_bytes,
        }

    @staticmethod
    def from_json(data: dict, source: str = "<plan>") -> "Target":
        return parse_target({"target": data}, source)


@dataclass(frozen=True)
class Machine:
    """A target seen through one operand dtype: what ``irc.npu.cost`` reads."""

    target: str
    dtype: str
    rows: int
    cols: int
    rate: float
    op_bytes: int
    acc_bytes: int
    out_bytes: int
    accumulator: str       # "int32", "fp32", ...
    is_float: bool
    align: int
    k_align: int           # reduction-tile step: one burst of operands
    sram_bytes: int
    dram_bw: float
    dma_channels: int
    dma_bw: float
    latency: int
    clock_hz: float

    @property
    def peak_macs(self) -> float:
        return self.rows * self.cols * self.rate

    def row_bytes(self, cols, width):
        """DMA bytes of one tile row of ``cols`` elements ``width`` bytes wide (whole bursts)."""
        return round_up(cols * width, self.align)


def accumulator_bytes(bits: int) -> int:
    size = 1
    while size * 8 < bits:
        size *= 2
    return size


def make_machine(target: Target, dtype: str, support: DTypeSupport) -> Machine:
    op_bytes, is_float = DTYPES[dtype]
    acc_bytes = accumulator_bytes(support.accumulator_bits)
    return Machine(target=target.name, dtype=dtype, rows=target.mac_rows, cols=target.mac_cols, rate=support.rate,
                   op_bytes=op_bytes, acc_bytes=acc_bytes, out_bytes=op_bytes,
                   accumulator=("fp" if is_float else "int") + str(acc_bytes * 8), is_float=is_float,
                   align=target.alignment_bytes, k_align=max(1, target.alignment_bytes // op_bytes),
                   sram_bytes=target.sram_bytes, dram_bw=target.dram_bytes_per_cycle,
                   dma_channels=target.dma_channels, dma_bw=target.dma_bytes_per_cycle,
                   latency=target.dram_latency_cycles, clock_hz=target.clock_mhz * 1e6)


def smallest_tile(machine: Machine) -> dict:
    """SRAM bytes of one MAC-array tile, single-buffered: A rows x burst, B cols x burst,
    C rows x cols accumulators."""
    burst = machine.row_bytes(machine.k_align, machine.op_bytes)
    return {"a": machine.rows * burst, "b": machine.cols * burst,
            "c": machine.rows * machine.row_bytes(machine.cols, machine.acc_bytes)}


# ---- reading YAML ----------------------------------------------------------------------

def _text(value):
    if not isinstance(value, str):
        raise yamlloc.Bad(f"expected a string, got {value!r}")
    return value


def _power_of_two(value):
    value = positive_int(value)
    if value & (value - 1):
        raise yamlloc.Bad(f"expected a power of two, got {value}")
    return value


def _rate(value):
    value = positive_number(value)
    if value > 1.0:
        raise yamlloc.Bad(f"expected a fraction of the array's peak in (0, 1], got {value:g}")
    return value


def load_target(path) -> Target:
    """Read and check a target file; SpecError at file:line:column on any mistake."""
    if not os.path.isfile(path):
        raise SpecError("cannot read the NPU target description: no such file", location=str(path),
                        hint="shipped targets are in examples/targets/")
    return parse_target(yamlloc.load_file(path), str(path))


def parse_target(data, source: str) -> Target:
    top = Fields(data, "", ("target",))
    t = top.sub("target", ("name", "summary", "clock_mhz", "sram", "mac", "dram", "dma", "alignment_bytes"),
                required=True)
    sram = t.sub("sram", ("bytes", "banks"), required=True)
    mac = t.sub("mac", ("rows", "cols", "dtypes"), required=True)
    dram = t.sub("dram", ("bytes_per_cycle", "latency_cycles"), required=True)
    dma = t.sub("dma", ("channels", "bytes_per_cycle")) or Fields({}, "target.dma", ())
    dram_bw = dram.get("bytes_per_cycle", positive_number)
    target = Target(
        name=t.get("name", string), summary=t.get("summary", _text, ""), clock_mhz=t.get("clock_mhz", positive_number),
        sram_bytes=sram.get("bytes", positive_int), sram_banks=sram.get("banks", positive_int, 1),
        mac_rows=mac.get("rows", positive_int), mac_cols=mac.get("cols", positive_int),
        dtypes=_dtypes(mac), dram_bytes_per_cycle=dram_bw,
        dram_latency_cycles=dram.get("latency_cycles", non_negative_int, 0),
        dma_channels=dma.get("channels", positive_int, 1), dma_bytes_per_cycle=dma.get("bytes_per_cycle",
                                                                                       positive_number, dram_bw),
        alignment_bytes=t.get("alignment_bytes", _power_of_two, 1))
    if target.sram_bytes % target.sram_banks:
        raise sram.error("banks", f"{target.sram_bytes} bytes do not split into {target.sram_banks} equal banks")
    for name, support in target.dtypes:
        machine = make_machine(target, name, support)
        need = smallest_tile(machine)
        if sum(need.values()) > target.sram_bytes:
            raise sram.error("bytes", f"{target.sram_bytes} bytes cannot hold one {machine.rows}x{machine.cols}x"
                             f"{machine.k_align} {name} tile of the MAC array (A {need['a']} + B {need['b']} + "
                             f"C {need['c']} bytes of {machine.accumulator} accumulators = {sum(need.values())} bytes)",
                             hint="give the SRAM at least that many bytes, or a smaller MAC array")
    return target


def _dtypes(mac: Fields) -> tuple:
    value = mac.data.get("dtypes")
    dtypes = mac.sub("dtypes", tuple(DTYPES), required=True)
    if not dtypes.data:
        raise mac.error("dtypes", "expected at least one operand dtype", hint=f"one of {', '.join(DTYPES)}")
    out = []
    for name in value:
        entry = dtypes.sub(name, ("rate", "accumulator_bits"), required=True) if dtypes.data[name] is not None \
            else Fields({}, dtypes.key_path(name), ())
        bits = entry.get("accumulator_bits", positive_int, 32)
        op_bits = DTYPES[name][0] * 8
        if bits < op_bits:
            raise entry.error("accumulator_bits", f"a {bits}-bit accumulator is narrower than {name} operands")
        out.append((name, DTypeSupport(rate=entry.get("rate", _rate, 1.0), accumulator_bits=bits)))
    return tuple(out)


__all__ = ["Target", "Machine", "DTYPES", "load_target", "parse_target", "smallest_tile", "ceil_div", "round_up"]
