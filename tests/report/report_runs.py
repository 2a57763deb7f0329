"""Pipeline runs for the report tests: the tiny DeepSeek-V2 through a lowering pipeline
held to the reference interpreter, and the full-size Llama-3-8B (weights absent) through
a lowering pipeline without the check. backends/onnx has not landed, so the tiny run uses
an explicit pipeline rather than the ONNX target's default."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import passes  # noqa: F401  (registers the passes)
from frontends import load_spec
from irc.analysis import stats_line
from irc.dot import graph_to_dot
from irc.graph import Graph
from irc.passmanager import PassManager, parse_pipeline
from irc.check import compare_outputs
from irc.weights import seed_absent

ROOT = Path(__file__).resolve().parents[2]
TINY_SPEC = "examples/tiny-deepseek-v2.yaml"
TINY_PIPELINE = "mla-absorb,lower-norms,lower-mlp,lower-linear,fold,cse,dce"
BIG_SPEC = "examples/llama3-8b.yaml"
BIG_PIPELINE = "lower-norms,lower-mlp,lower-linear,rope-fuse,gqa-broadcast,cse,dce"


@dataclass
class Run:
    spec: str
    dump_dir: str
    manager: PassManager
    input_graph: Graph
    graph: Graph


def run_pipeline(spec: str, pipeline: str, dump_dir: Path, check: bool) -> Run:
    graph = load_spec(str(ROOT / spec) if not Path(spec).is_absolute() else spec)
    if check:
        seed_absent(graph, 0)
    before = graph.clone()
    checker = (lambda a, b: compare_outputs(a, b, None, 0)) if check else None
    manager = PassManager(parse_pipeline(pipeline), dump_dir=str(dump_dir), checker=checker,
                          stats=lambda g: stats_line(g, 4096), dot=graph_to_dot)
    manager.run(graph)
    return Run(spec, str(dump_dir), manager, before, graph)
