"""The ALiBi families' full-size examples and Falcon's slopes against transformers (their
tiny twins are ``test_hf_models.CASES``' ``bloom-*``, ``mpt-*`` and ``falcon-alibi-*``, held
there through the interpreter and both ONNX targets; the other targets in
``test_hf_targets``): BLOOM-7B1's and MPT-7B's parameter counts equal transformers' on the
meta device, and Falcon's slopes are the bfloat16-rounded ones its ``build_alibi_tensor``
multiplies, over √head_dim."""
import json
from pathlib import Path

import numpy as np
import pytest

from frontends.hf import read_arch
from irc.analysis import analyze
from frontends import load_spec

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hf"


@pytest.mark.parametrize("name, billions", [("bloom-7b1", 7.07), ("mpt-7b", 6.65)])
def test_full_size_examples_count_transformers_parameters(name, billions):
    config = transformers.AutoConfig.from_pretrained(EXAMPLES / name)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    want = sum(p.numel() for p in model.parameters())
    got = analyze(load_spec(EXAMPLES / name))["params_total"]
    assert got == want and round(got / 1e9, 2) == billions


@pytest.mark.parametrize("heads", [4, 32, 12])
def test_falcon_slopes_are_transformers_bfloat16_products(tmp_path, heads):
    """Key 1 against query 0 of an unpadded row: transformers' bias is the slope (rounded to
    bfloat16) over √head_dim; irc's slopes are those numbers."""
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    config = {"model_type": "falcon", "hidden_size": 8 * heads, "num_hidden_layers": 1,
              "num_attention_heads": heads, "alibi": True, "vocab_size": 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    arch = read_arch(tmp_path)[0]
    bias = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), heads, torch.float32)[:, 0, 1]
    np.testing.assert_allclose(arch.attention.alibi, bias.numpy() / np.sqrt(8), rtol=1e-6)
    assert arch.layers[0].rope is None
