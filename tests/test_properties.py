"""Property tests over random small architectures, through the whole core: the YAML
architecture form (and so the DSL), the verifier, the printer/parser, the analysis and
the reference interpreter's KV-cache and padding semantics."""
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from irc.interpreter import Interpreter
from frontends import load_spec
from irc.analysis import analyze
from irc.parser import parse_graph
from irc.printer import print_graph
from irc.check import relative_error
from irc.verify import verify

VOCAB = 50


@st.composite
def architectures(draw):
    heads = draw(st.sampled_from([2, 4]))
    kv_heads = draw(st.sampled_from([k for k in (1, 2, 4) if heads % k == 0]))
    head_dim = draw(st.sampled_from([8, 16]))
    window = draw(st.sampled_from([None, 3, 5]))
    lines = [
        "model:", "  name: prop", f"  vocab_size: {VOCAB}", f"  d_model: {draw(st.sampled_from([32, 48]))}",
        f"  n_layers: {draw(st.integers(1, 2))}",
        f"  norm: {{kind: {draw(st.sampled_from(['rms', 'layer']))}, eps: 1.0e-5}}",
        "  attention:", "    kind: gqa", f"    n_heads: {heads}", f"    n_kv_heads: {kv_heads}",
        f"    head_dim: {head_dim}",
        f"    rope: {{base: 10000, convention: {draw(st.sampled_from(['half', 'interleaved']))}}}",
        f"    qk_norm: {str(draw(st.booleans())).lower()}",
    ]
    if window:
        lines += [f"    window: {window}", "    window_pattern: [local, global]"]
    if draw(st.booleans()):
        lines.append("    softcap: 20.0")
    if draw(st.booleans()):
        lines += ["  moe: {experts: 4, top_k: 2, d_ff: 16, router: softmax, norm_topk_prob: true}"]
    else:
        kind = draw(st.sampled_from(["swiglu", "geglu", "gelu"]))
        lines.append(f"  mlp: {{kind: {kind}, d_ff: 40}}")
    lines.append(f"  tied_embeddings: {str(draw(st.booleans())).lower()}")
    if draw(st.booleans()):
        lines.append("  final_softcap: 15.0")
    return "\n".join(lines) + "\n", (kv_heads, head_dim)


def feeds_for(graph, ids, mask, positions, caches):
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    feeds.update(caches)
    return feeds


def empty_caches(graph, batch):
    return {v.name: np.zeros((batch, v.shape[1], 0, v.shape[3]), np.float32)
            for v in graph.inputs if v.name.startswith("past_key_values.")}


def step(interp, graph, ids, mask, positions, caches):
    out = interp.run(feeds_for(graph, ids, mask, positions, caches))
    caches = {name: out["present." + name[len("past_key_values."):]] for name in caches}
    return out["logits"], caches




@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arch=architectures(), seed=st.integers(0, 2**16))
def test_random_architectures(tmp_path, arch, seed):
    text, (kv_heads, head_dim) = arch
    spec = tmp_path / "prop.yaml"
    spec.write_text(text)
    graph = load_spec(spec)
    verify(graph)

    # the text form round-trips exactly
    printed = print_graph(graph)
    assert print_graph(parse_graph(printed)) == printed

    # the analysis reads the cache off the graph
    summary = analyze(graph)
    assert summary["kv_cache_elements_per_token_per_layer"] == 2 * kv_heads * head_dim

    rng = np.random.default_rng(seed)
    interp = Interpreter(graph, seed=seed)
    tokens = rng.integers(0, VOCAB, size=(1, 7))

    # prefill of everything == prefill of a prefix, then decode one token at a time
    full, _ = step(interp, graph, tokens, np.ones((1, 7), np.int64), np.arange(7)[None], empty_caches(graph, 1))
    logits, caches = step(interp, graph, tokens[:, :4], np.ones((1, 4), np.int64), np.arange(4)[None],
                          empty_caches(graph, 1))
    pieces = [logits]
    for t in range(4, 7):
        logits, caches = step(interp, graph, tokens[:, t:t + 1], np.ones((1, t + 1), np.int64),
                              np.array([[t]]), caches)
        pieces.append(logits)
    assert relative_error(np.concatenate(pieces, axis=1), full) < 1e-5

    # left padding changes nothing for the real tokens of a row
    pad = 3
    ids = np.concatenate([np.zeros((1, pad), np.int64), tokens], axis=1)
    mask = np.concatenate([np.zeros((1, pad), np.int64), np.ones((1, 7), np.int64)], axis=1)
    positions = np.concatenate([np.zeros((1, pad), np.int64), np.arange(7)[None]], axis=1)
    padded, _ = step(interp, graph, ids, mask, positions, empty_caches(graph, 1))
    assert relative_error(padded[:, pad:], full) < 1e-5
