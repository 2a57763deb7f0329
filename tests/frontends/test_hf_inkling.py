"""Inkling, Inkling-2 and Inkling-2-Loop (``frontends.hf.families_inkling*``) beyond the twins of
``test_hf_models``: a prompt fed in two chunks (the second with a past, P > 0 and T > 1: the
slots the relative bias and the windows read, the convolution states, Inkling-2's dynamic
convolutions gathering across the state) gives transformers' logits of the whole prompt; the
loop's unrolled invocations read their layer's params and keep caches of their own; its
``loop_config`` block is read as transformers reads it."""
import json

import numpy as np
import pytest

from frontends import load_spec
from frontends.hf.config import Config
from frontends.hf.families import describe
from irc.interpreter import Interpreter
from tests.frontends.test_hf_models import CASES, TOLERANCE, build_case, built_once, prompts, relative_error

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TWINS = ["inkling-sliding-dense-then-full-moe-log-scaled", "inkling2-sliding-full-sliding-blocks-of-2",
         "inkling2-loop-three-passes-blocks-of-1"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return built_once(build_case, tmp_path_factory)


def run_chunks(graph, ids: np.ndarray, split: int) -> np.ndarray:
    """Logits [1, T, V] of ``ids`` [1, T] fed as ids[:, :split] from empty caches, then the
    rest with the presents of the first chunk."""
    names = {v.name for v in graph.inputs}
    past = {v.name: np.zeros((1,) + tuple(0 if d == "P" else d for d in v.shape[1:]), np.float32)
            for v in graph.inputs if v.name.startswith("past_key_values.")}
    outputs = []
    for start, stop in ((0, split), (split, ids.shape[1])):
        feeds = {"input_ids": ids[:, start:stop], "attention_mask": np.ones((1, stop), np.int64),
                 "position_ids": np.arange(start, stop)[None], **past}
        out = Interpreter(graph).run({k: v for k, v in feeds.items() if k in names})
        past = {name: out["present." + name[len("past_key_values."):]] for name in past}
        outputs.append(out["logits"])
    return np.concatenate(outputs, axis=1)


@pytest.mark.parametrize("name", TWINS)
def test_a_prompt_in_two_chunks_gives_transformers_logits(models, name):
    model, folder = models(name)
    ids = prompts()[0][:1]
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids)).logits.float().numpy()
    got = run_chunks(load_spec(folder), ids, 6)
    assert relative_error(got, want) <= TOLERANCE


def test_loop_invocations_share_params_and_keep_their_own_caches(models):
    name = "inkling2-loop-three-passes-blocks-of-1"
    _, folder = models(name)
    graph = load_spec(folder)
    overrides = CASES[name][1]
    layers = overrides["num_hidden_layers"]
    loop = overrides["loop_layer_index_end"] - overrides["loop_layer_index_start"]
    runs = layers + (overrides["loop_num_passes"] - 1) * loop  # transformers' total_num_hidden_layers
    layer_params = {int(n.split(".")[1]) for n in graph.params if n.startswith("layers.")}
    assert layer_params == set(range(layers))
    caches = {int(v.name.split(".")[1]) for v in graph.inputs if v.name.startswith("past_key_values.")}
    assert caches == set(range(runs))
    assert graph.meta["n_layers"] == runs


def test_loop_config_block_is_read_as_transformers_reads_it(tmp_path):
    data = {"model_type": "inkling2_loop_text", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 6,
            "num_attention_heads": 4, "num_key_value_heads": 2, "n_layers_per_attn_res_block": 2,
            "loop_config": {"core_start": 2, "core_end": 6, "num_passes": 2, "gate_rank": 8}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    arch = describe(Config(data, str(path), path.read_text()), "loop")
    config = transformers.Inkling2LoopTextConfig(**{k: v for k, v in data.items() if k != "model_type"})
    assert arch.n_layers == config.total_num_hidden_layers == 10
    loop = arch.expand.args[1]
    assert (loop.start, loop.end, loop.passes, loop.rank) == (config.loop_layer_index_start,
                                                              config.loop_layer_index_end, config.loop_num_passes,
                                                              config.loop_gate_rank)
