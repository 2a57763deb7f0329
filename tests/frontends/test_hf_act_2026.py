"""What ``test_hf_models``' twins of ``families_act_2026`` and ``families_diff`` do not show:

- Kolibri-1's router: ``irc.ops.moe.route`` with ``scoring="sigmoid_logits"`` gives the experts
  and weights of transformers' ``Kolibri1TopKRouter`` (top-k of logits + bias, sigmoid weights),
  with a bias large enough that choosing on sigmoid scores + bias would differ;
- config.json files without ``rope_parameters`` read as the config classes fill them in
  (Apertus: llama3 scaling; Laguna: per-layer-type RoPE, partial rotary on full layers);
- xIELU's ``beta`` and ``eps`` are 0-d checkpoint tensors and stay 0-d params;
- DiffLlama's λ_init per layer is transformers' ``lambda_init_fn``."""
import json

import numpy as np
import pytest

from frontends import load_spec
from tests.frontends.test_hf_models import (SMALL, TOLERANCE, hf_logits, irc_logits, prompts, randomize,
                                            relative_error, save_twin)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_kolibri_router_matches_transformers(norm_topk_prob):
    from irc.ops.moe import route
    from transformers.models.kolibri1.modeling_kolibri1 import Kolibri1TopKRouter

    config = transformers.Kolibri1Config(**{**SMALL, "num_experts": 8, "num_experts_per_tok": 3,
                                            "norm_topk_prob": norm_topk_prob})
    router = Kolibri1TopKRouter(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=generator))
        router.e_score_correction_bias.copy_(3.0 * torch.randn(8, generator=generator))
        x = torch.randn(40, 32, generator=generator)
        _, want_weights, want_ids = router(x)
    weight, bias = router.weight.detach().numpy(), router.e_score_correction_bias.numpy()
    ids, weights = route(x.numpy(), weight, bias, top_k=3, scoring="sigmoid_logits", norm_topk_prob=norm_topk_prob)
    np.testing.assert_array_equal(ids, want_ids.numpy())
    np.testing.assert_allclose(weights, want_weights.numpy(), rtol=1e-6, atol=1e-7)
    other, _ = route(x.numpy(), weight, bias, top_k=3, scoring="sigmoid", norm_topk_prob=norm_topk_prob)
    assert (other != ids).any()  # the two selections differ: the twin's router is not DeepSeek-V3's


def without_rope_parameters(config, tmp_path):
    """A twin of ``config`` saved, then its config.json without ``rope_parameters``: (model, folder)."""
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=7, norm_centre=1.0)
    save_twin(model, tmp_path)
    path = tmp_path / "config.json"
    data = json.loads(path.read_text())
    del data["rope_parameters"]
    path.write_text(json.dumps(data, indent=2))
    return model, tmp_path


@pytest.mark.parametrize("class_name, overrides", [
    ("ApertusConfig", {"max_position_embeddings": 16384}),  # llama3 scaling past its 8192 positions
    ("LagunaConfig", {"head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                      "shared_expert_intermediate_size": 16, "sliding_window": 4,
                      "layer_types": ["sliding_attention", "full_attention"]})])
def test_a_config_without_rope_parameters_reads_the_class_defaults(tmp_path, class_name, overrides):
    model, folder = without_rope_parameters(getattr(transformers, class_name)(**{**SMALL, **overrides}), tmp_path)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    got = irc_logits(load_spec(folder), ids, mask, positions)
    assert relative_error(got[real], hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE


def test_xielu_scalars_stay_scalars(tmp_path):
    model = transformers.AutoModelForCausalLM.from_config(transformers.ApertusConfig(**SMALL)).eval()
    save_twin(model, tmp_path)
    graph = load_spec(tmp_path)
    for name in ("beta", "eps"):
        param = graph.params[f"layers.1.mlp.act.{name}"]
        assert param.shape == () and param.array().shape == ()
    assert float(graph.params["layers.0.mlp.act.beta"].array()) == 0.5


def test_diffllama_lambda_init_is_transformers():
    from frontends.hf.families_diff import lambda_init
    from transformers.models.diffllama.modeling_diffllama import lambda_init_fn

    assert [lambda_init(i) for i in range(6)] == [lambda_init_fn(i) for i in range(6)]
