"""Recurrent layers on --target onnx-npu (backends/onnx_npu/recurrent.py and recurrent_steps.py):
the hybrids (Mamba-2, gated DeltaNet, LFM2 short convs, Jamba's Mamba-1 scan, Kimi's per-channel
decay, beside attention and MoE; RWKV-4 and RecurrentGemma from Hugging Face configs) as static
graphs with
fixed-size states, through the host loop on ONNX Runtime's CPU provider.

f32: the reference interpreter's greedy tokens exactly and every prompt position's logits
within 1e-4 relative (the chunk form of the recurrence is exact math, so this pins the
lowering). fp16: over the steps after the prompt, the logits no farther from the f32
reference on average than 1e-2 relative plus the mean distance of the reference
interpreter's own run of the fp16 graph the target emits (these tiny random twins amplify
fp16 rounding: that graph is up to 3e-2 off the f32 one on tiny-qwen3-next, 4e-2 on
tiny-minimax and tiny-jamba, where one step of four lands 1.5e-2 beyond its own run's
distance and the mean 0.6e-2; so f32 is the check of the math, fp16 that onnx-npu's fp16 is
about as good as irc's own)."""
import json

import numpy as np
import onnx
import pytest

from backends.onnx_npu import recurrent
from backends.onnx_npu.host import Host, generate, load_contract, prefill_logits
from frontends import load_spec
from irc.check import relative_error
from irc.errors import IRCError
from irc.evaluate import StreamingInterpreter
from irc.evaluate import prefill_logits as reference_prefill
from irc.interpreter import generate as reference_generate
from irc.passmanager import PassManager, parse_pipeline
from irc_cli.commands import main
from test_onnx_npu import PROMPT, RECURRENT, compile_npu

HYBRIDS = RECURRENT
PIPELINE = "retype{dtype=f16},lower-norms,lower-mlp,lower-softcap,fold,dce,cse"   # what --target onnx-npu runs


def test_the_hybrids_are_covered():
    names = {spec.split("tiny-")[1] for spec in HYBRIDS}
    assert {"mamba2-2.7b.yaml", "qwen3-next-80b-a3b.yaml", "lfm2-1.2b.yaml", "granite-4.0-h-small.yaml",
            "jamba-1.5-mini.yaml", "kimi-linear.yaml"} <= names


@pytest.mark.parametrize("spec", HYBRIDS)
def test_host_loop_matches_interpreter(spec, tmp_path):
    """Prefill of 11 tokens at chunk 4: two chunk calls, then three decode calls (every token
    a call runs is real), then decode."""
    graph = load_spec(spec)
    expected, _ = reference_generate(graph, PROMPT, 4, seed=0)
    exact = compile_npu(spec, tmp_path / "f32", "--precision", "f32")
    assert generate(str(exact), PROMPT, 4) == expected
    ids = PROMPT + expected[:-1]
    reference = reference_prefill(StreamingInterpreter(graph, 0), ids)
    got = prefill_logits(str(exact), ids)
    assert max(relative_error(got[i], reference[i]) for i in range(len(ids))) < 1e-4
    folder = compile_npu(spec, tmp_path / "fp16")
    half = load_spec(spec)
    PassManager(parse_pipeline(PIPELINE)).run(half)
    steps = slice(len(PROMPT) - 1, None)
    own = reference_prefill(StreamingInterpreter(half, 0), ids)[steps].astype(np.float32)
    got = prefill_logits(str(folder), ids)[steps].astype(np.float32)
    theirs = np.mean([relative_error(g, r) for g, r in zip(got, reference[steps])])
    assert theirs < 1e-2 + np.mean([relative_error(o, r) for o, r in zip(own, reference[steps])])


def test_static_graphs_with_fixed_states(tmp_path):
    """The states are whole inputs and outputs of both graphs, static, in the contract; no
    control flow and no ONNX Runtime contrib op reaches the NPU compiler."""
    folder = compile_npu("examples/tiny-qwen3-next-80b-a3b.yaml", tmp_path / "m")
    contract = load_contract(str(folder))
    states = {s["past"]: s for s in contract["states"]}
    assert states["past_key_values.0.conv_state"]["shape"] == [1, 128, 3]
    assert states["past_key_values.0.recurrent_state"]["shape"] == [1, 4, 16, 16]
    assert not set(states) & {c["past"] for c in contract["caches"]}
    for role, tokens in (("chunk", 4), ("decode", 1)):
        model = onnx.load(str(folder / contract["graphs"][role]), load_external_data=False)
        shapes = {v.name: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in
                           v.type.tensor_type.shape.dim] for v in [*model.graph.input, *model.graph.output]}
        assert shapes["present.0.recurrent_state"] == shapes["past_key_values.0.recurrent_state"] == [1, 4, 16, 16]
        assert shapes["present.0.conv_state"] == [1, 128, 3]
        assert all(isinstance(d, int) for dims in shapes.values() for d in dims)
        ops = {n.op_type for n in model.graph.node}
        assert not ops & {"Scan", "Loop", "If", "Shape", "Range"} and {n.domain for n in model.graph.node} == {""}
        assert {"MatMul", "Exp", "Softplus", "Conv"} <= ops


# Hugging Face configs of the recurrences the YAML examples lack (RWKV-4's WKV and token shift,
# RecurrentGemma's RG-LRU beside windowed MQA with partial rotary, Ling's KDA with its safe forget
# gate (a log) beside MLA): config-only, seeded weights
HF_RECURRENT = {
    "rwkv": {"model_type": "rwkv", "vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 2,
             "attention_hidden_size": 32, "intermediate_size": 64, "context_length": 64},
    "recurrent_gemma": {"model_type": "recurrent_gemma", "vocab_size": 256, "hidden_size": 32,
                        "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
                        "num_key_value_heads": 1, "attention_window_size": 6, "lru_width": 32, "conv1d_width": 4,
                        "block_types": ["recurrent", "recurrent", "attention"]},
    "bailing_hybrid": {"model_type": "bailing_hybrid", "vocab_size": 256, "hidden_size": 32, "num_attention_heads": 4,
                       "num_key_value_heads": 4, "head_dim": 8, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                       "qk_rope_head_dim": 4, "v_head_dim": 6, "intermediate_size": 48, "moe_intermediate_size": 16,
                       "num_experts": 8, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
                       "max_position_embeddings": 64, "short_conv_kernel_size": 3, "num_hidden_layers": 3,
                       "layer_types": ["full_attention", "linear_attention", "linear_attention"],
                       "mlp_layer_types": ["sparse", "dense", "sparse"], "q_lora_rank": 12, "kda_lower_bound": -3.0},
}


def hf_recurrent_folder(name: str, where) -> str:
    """A config-only folder of ``HF_RECURRENT[name]``."""
    folder = where / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(HF_RECURRENT[name]))
    return str(folder)


@pytest.mark.parametrize("name", sorted(HF_RECURRENT))
def test_hf_config_recurrences_match_the_interpreter(name, tmp_path):
    """f32, seeded weights: the host loop (two chunk calls, then decode) gives the reference
    interpreter's greedy tokens and every prompt position's logits within 1e-4."""
    folder = hf_recurrent_folder(name, tmp_path)
    graph = load_spec(folder)
    expected, _ = reference_generate(graph, PROMPT, 4, seed=0)
    exact = compile_npu(folder, tmp_path / "f32", "--precision", "f32", "--weights", "seeded")
    assert generate(str(exact), PROMPT, 4) == expected
    ids = PROMPT + expected[:-1]
    reference = reference_prefill(StreamingInterpreter(graph, 0), ids)
    got = prefill_logits(str(exact), ids)
    assert max(relative_error(got[i], reference[i]) for i in range(len(ids))) < 1e-4


def test_a_short_chunk_is_refused(tmp_path):
    folder = compile_npu("examples/tiny-mamba2-2.7b.yaml", tmp_path / "m")
    host = Host(load_contract(str(folder)), engines={})
    with pytest.raises(IRCError, match="a recurrent state would take the padding in"):
        host.step("chunk", [1, 2])


def test_masks_are_exact_sums():
    """segments gives Σ_{j<k<=i} a_k per pair (empty on and above the diagonal); inclusive
    and after split the chunk's total at every token."""
    a = np.arange(1.0, 6.0, dtype=np.float32)
    pairs = (recurrent.segments(5) @ a).reshape(5, 5)
    assert pairs[4, 1] == a[2] + a[3] + a[4] and pairs[2, 2] == 0 and pairs[1, 3] == 0
    assert np.array_equal(recurrent.inclusive(5) @ a + recurrent.after(5) @ a, np.full(5, a.sum()))


def test_irc_run_drives_a_hybrid_folder(tmp_path, capsys):
    """`irc run FOLDER` (irc_cli/engines.py's onnx-npu runner) carries the states: the
    reference interpreter's greedy tokens."""
    spec = "examples/tiny-qwen3-next-80b-a3b.yaml"
    folder = compile_npu(spec, tmp_path / "m", "--precision", "f32")
    expected, _ = reference_generate(load_spec(spec), PROMPT, 4, seed=0)
    capsys.readouterr()
    assert main(["run", str(folder), "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "4",
                 "--json"]) == 0
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[0])
    assert answer["engine"] == "onnx-npu host loop" and answer["tokens"] == expected
