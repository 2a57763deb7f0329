"""CLIP's and SigLIP's dual encoders whole (``frontends.hf.dual_text``): the text tower beside the
image tower, against transformers 5.25's CLIPModel and SiglipModel on tiny random twins:
``text_embeds`` of a right-padded batch (CLIP: causal attention, pooled at each row's first eos
token; SigLIP: bidirectional, pooled at the last position) and ``logits_per_image`` through the
reference interpreter and the ONNX folder (``model.onnx`` + ``text.onnx`` + ``irc_dual.json``);
``irc run --image --text`` gives transformers' zero-shot scores; a one-model target says it
leaves the text tower out; a bad text setting names its key."""
import json

import numpy as np
import pytest

from frontends import load_spec
from frontends.hf.dual_text import similarity
from irc.check import relative_error
from irc.errors import SpecError
from irc.interpreter import run
from irc_cli import main
from tests.frontends.test_hf_models import built_once

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4
BOS, EOS = 0, 1
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, image_size=16,
              patch_size=4)
TEXT = dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=2, intermediate_size=40, vocab_size=99,
            bos_token_id=BOS, eos_token_id=EOS, pad_token_id=EOS, max_position_embeddings=12)
CASES = {"clip": ("CLIPModel", "CLIPConfig", dict(projection_dim=20), {}),
         "siglip": ("SiglipModel", "SiglipConfig", {}, dict(projection_size=32))}


def build(name: str, folder):
    model_class, config_class, extra, text = CASES[name]
    config = getattr(transformers, config_class)(vision_config=VISION, text_config={**TEXT, **text}, **extra)
    model = getattr(transformers, model_class)(config).eval()
    generator = torch.Generator().manual_seed(sorted(CASES).index(name))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * (0.5 if p.ndim <= 1 else p.shape[-1] ** -0.5))
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    return built_once(build, tmp_path_factory)


def texts(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Two texts ending in eos, the shorter right-padded (SigLIP: both to the full length)."""
    rows = [[BOS, 5, 7, 9, EOS], [BOS, 4, 6, 8, 11, 13, 2, EOS]]
    width = TEXT["max_position_embeddings"] if name == "siglip" else max(map(len, rows))
    ids = np.asarray([row + [EOS] * (width - len(row)) for row in rows], np.int64)
    mask = np.asarray([[1] * len(row) + [0] * (width - len(row)) for row in rows], np.int64)
    return ids, mask


def pixels() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((3, 3, 16, 16)).astype(np.float32)


def reference(model, ids, mask, pixel_values):
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                    pixel_values=torch.from_numpy(pixel_values))
        text = model.get_text_features(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    return getattr(text, "pooler_output", text).numpy(), out.logits_per_image.numpy()


def image_embeds(outputs: dict) -> np.ndarray:
    return outputs.get("image_embeds", outputs.get("pooler_output"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_interpreter_gives_transformers_logits(twins, name):
    model, folder = twins(name)
    graph = load_spec(folder)
    text = graph.parts["text"]
    ids, mask = texts(name)
    want_text, want_logits = reference(model, ids, mask, pixels())
    got_text = run(text, {"input_ids": ids, "attention_mask": mask})["text_embeds"]
    assert relative_error(got_text, want_text) <= TOLERANCE
    logits = similarity(image_embeds(run(graph, {"pixel_values": pixels()})), got_text, text.meta["logit_scale"],
                        text.meta.get("logit_bias", 0.0))
    assert relative_error(logits, want_logits) <= TOLERANCE
    assert ("logit_bias" in text.meta) == (name == "siglip")


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_onnx_folder_gives_transformers_logits(twins, tmp_path, name, target):
    from backends.onnx.runtime import ort_engine

    model, folder = twins(name)
    out = tmp_path / "out"
    assert main(["compile", str(folder), "--target", target, "-o", str(out / "model.onnx"), "--quiet"]) == 0
    manifest = json.loads((out / "irc_dual.json").read_text())
    assert manifest["image"] == "model.onnx" and manifest["text"] == "text.onnx"
    ids, mask = texts(name)
    _, want = reference(model, ids, mask, pixels())
    text = ort_engine(str(out / "text.onnx"))({"input_ids": ids, "attention_mask": mask})["text_embeds"]
    image = image_embeds(ort_engine(str(out / "model.onnx"))({"pixel_values": pixels()}))
    logits = similarity(image, text, manifest["logit_scale"], manifest.get("logit_bias", 0.0))
    assert relative_error(logits, want) <= TOLERANCE


def tiny_tokenizer(folder) -> None:
    """A word-level tokenizer.json (w2 ... w98) that writes <s> ... </s> around each text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    table = {"<s>": BOS, "</s>": EOS, **{f"w{i}": i for i in range(2, TEXT["vocab_size"])}}
    tokenizer = Tokenizer(models.WordLevel(table, unk_token="</s>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", BOS),
                                                                                                   ("</s>", EOS)])
    tokenizer.save(str(folder / "tokenizer.json"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_irc_run_scores_an_image_against_texts(twins, tmp_path, capsys, name):
    """The HF folder (interpreter) and its ONNX folder: transformers' logits_per_image for the
    processor's pixels and the texts as the tokenizer writes and the processor pads them;
    softmax scores (CLIP) or a sigmoid each (SigLIP)."""
    from PIL import Image

    model, folder = twins(name)
    tiny_tokenizer(folder)
    processor = transformers.CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    processor.save_pretrained(folder)
    image = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(3).random((20, 24, 3)) * 255).astype(np.uint8)).save(image)
    out = tmp_path / "out"
    assert main(["compile", str(folder), "--target", "onnx", "-o", str(out / "model.onnx"), "--quiet"]) == 0
    for file in ("tokenizer.json", "preprocessor_config.json"):
        assert (out / file).exists(), file  # the companions go with the folder
    ids, mask = texts(name)
    if name == "siglip":  # its processor pads to the full length and gives no mask: the padding is attended
        mask[:] = 1
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                     pixel_values=processor(Image.open(image), return_tensors="pt")["pixel_values"]
                     ).logits_per_image[0].numpy()
    for source in (str(folder), str(out)):
        assert main(["run", source, "--image", str(image), "--text", "w5 w7 w9", "--text", "w4 w6 w8 w11 w13 w2",
                     "--json", "--quiet"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["texts"] == ["w5 w7 w9", "w4 w6 w8 w11 w13 w2"]
        assert relative_error(np.asarray(report["logits_per_image"]), want) <= TOLERANCE, source
        scores = np.asarray(report["scores"])
        expected = 1 / (1 + np.exp(-want)) if name == "siglip" else np.exp(want) / np.exp(want).sum()
        assert np.allclose(scores, expected, atol=1e-5)


def test_one_model_targets_say_they_leave_the_text_tower_out(twins, tmp_path, capsys):
    _, folder = twins("clip")
    assert main(["compile", str(folder), "--target", "numpy", "-o", str(tmp_path / "m.py")]) == 0
    assert "the text tower is not written: --target numpy writes one model" in capsys.readouterr().err


def test_text_with_no_dual_encoder_is_refused(twins, capsys):
    _, folder = twins("clip")
    assert main(["run", str(folder), "--text", "w5"]) == 2
    assert "--text goes with --image" in capsys.readouterr().err


def test_a_bad_text_setting_names_its_key(twins, tmp_path):
    _, folder = twins("clip")
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["hidden_act"] = "relu"
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    with pytest.raises(SpecError) as err:
        load_spec(tmp_path)
    assert 'text_config.hidden_act: "relu" is not supported' in str(err.value)
