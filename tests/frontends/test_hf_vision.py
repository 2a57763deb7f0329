"""Vision encoders (``frontends.hf.vision``) against transformers 5.25 on tiny random twins:
ViT (the base model with its pooler, and a classifier's checkpoint under ``vit.`` without
one), DINOv2 with and without registers, CLIP's and SigLIP's vision towers. Each saved as
transformers saves it gives the base model's ``last_hidden_state`` and ``pooler_output`` on a
batch of two images through the reference interpreter, the NumPy module and both ONNX targets
(<= 1e-4 relative), with transformers' parameter count; config.json mistakes are one
SpecError naming the key."""
import importlib.util
import json
import os

import numpy as np
import pytest

from frontends import load_spec
from irc.analysis import analyze
from irc.check import relative_error
from irc.errors import SpecError
from irc.interpreter import run
from irc_cli import main
from tests.frontends.refusals import refused_changes
from tests.frontends.test_hf_models import built_once
from tests.frontends.twin_fixtures import once_fixture
from tests.frontends.vlm_checks import assert_outputs_match, tower_outputs

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, image_size=16,
             patch_size=4, num_channels=3)
CASES = {  # name: (model class, config class, overrides of SMALL)
    "vit": ("ViTModel", "ViTConfig", dict(layer_norm_eps=1e-6)),
    "vit-classifier-no-pooler": ("ViTForImageClassification", "ViTConfig", dict(patch_size=8, num_labels=5)),
    "dinov2-layerscale": ("Dinov2Model", "Dinov2Config", dict(layerscale_value=0.5, mlp_ratio=2)),
    "dinov2-registers": ("Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", dict(num_register_tokens=3)),
    # saved in bf16: tokens, positions and LayerScale meet f32 activations through a cast
    "dinov2-registers-bf16": ("Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", dict(num_register_tokens=1)),
    "clip-vision-quick-gelu": ("CLIPVisionModel", "CLIPVisionConfig", dict(num_channels=1)),
    # 14 pixels in patches of 4: 3 x 3, the last 2 rows and columns dropped (so400m: 384 / 14)
    "siglip-vision-pooling-head": ("SiglipVisionModel", "SiglipVisionConfig", dict(image_size=14)),
    "siglip-vision-no-head": ("SiglipVisionModel", "SiglipVisionConfig", dict(vision_use_head=False)),
}


def build(name: str, folder):
    model_class, config_class, overrides = CASES[name]
    config = getattr(transformers, config_class)(**{**SMALL, **overrides})
    return seeded_and_saved(getattr(transformers, model_class)(config).eval(), sorted(CASES).index(name),
                            name.endswith("-bf16"), folder)


def seeded_and_saved(model, seed: int, bf16: bool, folder):
    """``model`` with seeded weights (vectors 0.5 · N(0, 1), matrices 1/sqrt(fan-in)) saved to
    ``folder`` (in bf16 with ``bf16``: the reference then runs the rounded weights in float32);
    (the reference, the folder)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * (0.5 if p.ndim <= 1 else p.shape[-1] ** -0.5))
    if bf16:
        model.to(torch.bfloat16).save_pretrained(folder)
        return model.float(), folder
    model.save_pretrained(folder)
    return model, folder


twins = once_fixture(build, "twins")


def images(config) -> np.ndarray:
    size = config.image_size
    return np.random.default_rng(7).standard_normal((2, config.num_channels, size, size)).astype(np.float32)


def hf_outputs(model, pixels) -> dict:
    base = getattr(model, "vit", model)  # a classifier's base model
    with torch.no_grad():
        out = base(pixel_values=torch.from_numpy(pixels))
    return tower_outputs(out)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_interpreter_gives_transformers_outputs(twins, name):
    model, folder = twins(name)
    graph = load_spec(folder)
    pixels = images(model.config)
    assert_outputs_match(run(graph, {"pixel_values": pixels}), hf_outputs(model, pixels))
    base = getattr(model, "vit", model)  # DINOv2's mask_token serves pretraining only: irc reads it not
    held = sum(p.numel() for name, p in base.named_parameters() if name != "embeddings.mask_token")
    assert analyze(graph)["params_total"] == held


@pytest.mark.parametrize("target", ["onnx", "onnx-ort", "numpy"])
@pytest.mark.parametrize("name", ["clip-vision-quick-gelu", "dinov2-registers", "siglip-vision-pooling-head", "vit"])
def test_the_targets_give_transformers_outputs(twins, tmp_path, capsys, name, target):
    model, folder = twins(name)
    pixels = images(model.config)
    if target == "numpy":
        path = tmp_path / "model.py"
        assert main(["compile", str(folder), "--target", "numpy", "-o", str(path)]) == 0
        spec = importlib.util.spec_from_file_location("vision_np", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        got = module.forward(module.load_weights(), pixel_values=pixels)
    else:
        from backends.onnx import runtime
        path = tmp_path / "out" / "model.onnx"
        assert main(["compile", str(folder), "--target", target, "-o", str(path)]) == 0
        got = runtime.ort_engine(str(path))({"pixel_values": pixels})
    capsys.readouterr()
    assert_outputs_match(got, hf_outputs(model, pixels))


def test_show_counts_an_image(twins, capsys):
    _, folder = twins("vit")
    assert main(["show", str(folder), "--json"]) == 0
    vision = json.loads(capsys.readouterr().out)["vision"]
    # patches 16·(2·3·16·32) + 2 layers · 17 tokens · (2·7,168 weights + 2·2·17·32 attention) + pooler 2·32·32
    assert (vision["patches"], vision["tokens"], vision["flops_per_image"]) == (16, 17, 612_608)
    assert main(["show", str(folder)]) == 0
    assert "tokens per image  17" in capsys.readouterr().out


EXAMPLES = {  # examples/hf/NAME (config.json alone): the transformers class that holds the same model
    "clip-vit-large-patch14-336": "CLIPVisionModel", "siglip-so400m-patch14-384": "SiglipVisionModel",
    "dinov2-large": "Dinov2Model"}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_full_size_examples_count_transformers_parameters(name):
    """CLIP ViT-L/14-336 (LLaVA-1.5's tower: 576 patches), SigLIP-so400m (384 pixels in patches
    of 14: 27 x 27) and DINOv2-L, built by transformers on the meta device."""
    folder = f"{os.path.dirname(__file__)}/../../examples/hf/{name}"
    config = transformers.AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = getattr(transformers, EXAMPLES[name])(config)
    held = sum(p.numel() for n, p in model.named_parameters() if n != "embeddings.mask_token")
    summary = analyze(load_spec(folder))
    assert summary["params_total"] == held
    assert summary["vision"]["patches"] == (config.image_size // config.patch_size) ** 2


def edited(twins, tmp_path, name: str, change: dict):
    _, folder = twins(name)
    config = json.loads((folder / "config.json").read_text())
    config.update(change)
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    return tmp_path


@pytest.mark.parametrize("name, change, message", [
    ("vit", {"hidden_act": "relu"}, 'hidden_act: "relu" is not supported'),
    ("vit", {"qkv_bias": False}, "qkv_bias: false is not supported"),
    ("vit", {"patch_size": 17}, "patch_size: 17 is larger than image_size 16"),
    ("dinov2-layerscale", {"use_swiglu_ffn": True}, "use_swiglu_ffn: true is not supported"),
    ("clip-vision-quick-gelu", {"num_attention_heads": 5}, "num_attention_heads: 5 heads do not divide hidden_size"),
    ("siglip-vision-no-head", {"image_size": [16, 32]}, "image_size: [16, 32] is not supported"),
])
def test_config_mistakes_are_spec_errors_naming_the_key(twins, tmp_path, capsys, name, change, message):
    folder = edited(twins, tmp_path, name, change)
    with pytest.raises(SpecError, match="config.json"):
        load_spec(folder)
    assert main(["compile", str(folder), "--target", "onnx", "-o", str(tmp_path / "out" / "model.onnx")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_that_does_not_fit_names_the_tensor(twins, tmp_path):
    _, folder = twins("vit")
    edited(twins, tmp_path, "vit", {"intermediate_size": 40})
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    with pytest.raises(SpecError, match=r"encoder.layer.0.intermediate.dense.weight has shape \[48, 32\]"):
        load_spec(tmp_path)


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_int4_towers_run_near_the_float_model(twins, tmp_path, capsys, target):
    """--quantize int4 on a tower: every linear as 4-bit codes (the patch projection, a conv
    weight, stays float), the quantize pass's error on the outputs reported by --check, and the
    ONNX model's image features near transformers' float ones."""
    model, folder = twins("dinov2-layerscale")  # widths 32 and 64: blocks of 32 divide them
    path = tmp_path / "out" / "model.onnx"
    assert main(["compile", str(folder), "--target", target, "--quantize", "int4", "--check", "-o", str(path)]) == 0
    printed = "".join(capsys.readouterr())
    assert "quantize: int4 codes" in printed and "moves the outputs by" in printed
    assert "float: @patch_embed" in printed
    from backends.onnx import runtime
    pixels = images(model.config)
    got = runtime.ort_engine(str(path))({"pixel_values": pixels})
    want = hf_outputs(model, pixels)
    error = relative_error(got["last_hidden_state"], want["last_hidden_state"])
    assert 1e-4 < error < 0.25, error


# ---- dual encoders: the image tower of a clip / siglip checkpoint ---------------------------

DUAL = {"clip": ("CLIPModel", "CLIPConfig", dict(projection_dim=20)), "siglip": ("SiglipModel", "SiglipConfig", {})}
TEXT = dict(hidden_size=24, num_hidden_layers=1, num_attention_heads=2, intermediate_size=40, vocab_size=99,
            bos_token_id=0, eos_token_id=1, pad_token_id=1)


@pytest.fixture(scope="module")
def duals(tmp_path_factory):
    def build_dual(name, folder):
        model_class, config_class, extra = DUAL[name]
        vision = {key: value for key, value in SMALL.items()}
        config = getattr(transformers, config_class)(vision_config=vision, text_config=TEXT, **extra)
        torch.manual_seed(sorted(DUAL).index(name))
        model = getattr(transformers, model_class)(config).eval()
        model.save_pretrained(folder)
        return model, folder
    return built_once(build_dual, tmp_path_factory)


@pytest.mark.parametrize("target", ["interpreter", "onnx-ort"])
@pytest.mark.parametrize("name", sorted(DUAL))
def test_dual_encoders_give_transformers_image_features(duals, tmp_path, capsys, name, target):
    """CLIP's image_embeds (the pooled state through visual_projection) and SigLIP's
    pooler_output are transformers' get_image_features; the text tower is left out."""
    model, folder = duals(name)
    graph = load_spec(folder)
    pixels = images(model.config.vision_config)
    if target == "interpreter":
        got = run(graph, {"pixel_values": pixels})
    else:
        from backends.onnx import runtime
        path = tmp_path / "model.onnx"
        assert main(["compile", str(folder), "--target", target, "-o", str(path)]) == 0
        capsys.readouterr()
        got = runtime.ort_engine(str(path))({"pixel_values": pixels})
    with torch.no_grad():
        features = model.get_image_features(pixel_values=torch.from_numpy(pixels))
        hidden = model.vision_model(pixel_values=torch.from_numpy(pixels)).last_hidden_state.numpy()
    features = getattr(features, "pooler_output", features).numpy()
    assert relative_error(got["image_embeds" if name == "clip" else "pooler_output"], features) <= TOLERANCE
    assert relative_error(got["last_hidden_state"], hidden) <= TOLERANCE
    assert not any(p.startswith("text") for p in graph.params)


@pytest.mark.parametrize("change, message", [
    ({"vision_config": None}, "vision_config: expected the image tower's settings (an object)"),
    ({"vision_config": {"hidden_act": "relu"}}, 'vision_config.hidden_act: "relu" is not supported'),
])
def test_dual_encoder_config_mistakes_name_the_inner_key(duals, tmp_path, change, message):
    _, folder = duals("clip")
    refused_changes(folder, tmp_path, change, message)


def test_run_gives_a_clip_checkpoints_image_embeds(duals, photographs, tmp_path, capsys):
    PIL = pytest.importorskip("PIL.Image")
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    model, folder = duals("clip")
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).symlink_to(folder / name)
    processor = CLIPImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    processor.save_pretrained(tmp_path)
    assert main(["run", str(tmp_path), "--image", str(photographs["coffee.png"]), "--json"]) == 0
    got = np.asarray(json.loads(capsys.readouterr().out)["image_embeds"], np.float32)
    with torch.no_grad():
        want = model.get_image_features(**processor(PIL.open(photographs["coffee.png"]), return_tensors="pt"))
    want = getattr(want, "pooler_output", want)[0].numpy()
    assert relative_error(got, want) <= TOLERANCE


@pytest.mark.parametrize("model_type", ["dinov2", "dinov2_with_registers"])
@pytest.mark.parametrize("side", [16, 20, 48])
def test_dinov2_runs_at_its_processors_image_size(tmp_path, model_type, side):
    """A DINOv2 checkpoint (here 32 pixels: an 8 x 8 position grid) with a processor that crops
    ``side`` pixels: irc builds the model for that side, its positions resized bicubically as
    transformers' ``interpolate_pos_encoding`` resizes them (down, odd and up)."""
    from transformers.models.bit.image_processing_pil_bit import BitImageProcessorPil

    config_class = transformers.Dinov2Config if model_type == "dinov2" else transformers.Dinov2WithRegistersConfig
    model_class = transformers.Dinov2Model if model_type == "dinov2" else transformers.Dinov2WithRegistersModel
    config = config_class(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=4,
                          mlp_ratio=2)
    torch.manual_seed(1)
    model = model_class(config).eval()
    with torch.no_grad():
        model.embeddings.position_embeddings.normal_()
    model.save_pretrained(tmp_path)
    BitImageProcessorPil(size={"shortest_edge": side}, crop_size={"height": side, "width": side}).save_pretrained(
        tmp_path)
    graph = load_spec(str(tmp_path))
    assert graph.meta["vision"]["image_size"] == [side, side]
    pixels = np.random.default_rng(side).standard_normal((2, 3, side, side)).astype(np.float32)
    got = run(graph, {"pixel_values": pixels})
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(pixels))
    assert relative_error(got["last_hidden_state"], out.last_hidden_state.numpy()) <= TOLERANCE
    assert relative_error(got["pooler_output"], out.pooler_output.numpy()) <= TOLERANCE
