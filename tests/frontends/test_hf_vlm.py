"""Vision-language models (``frontends.hf.vlm``) against transformers 5.25 on tiny random
twins: LLaVA with a CLIP tower (hidden_states[-2], the class token dropped) and with a SigLIP
tower (two feature layers concatenated, strategy "full", no projector bias, the text model a
Qwen2); Gemma 3 (SigLIP, 8 x 8 patches pooled to 16 tokens, sliding and global layers, one
image's tokens seeing each other: transformers given ``token_type_ids``); BLIP-2 (its ViT, a
three-layer Q-Former whose 8 queries cross-attend to the 17 patch states in layers 0 and 2, an
OPT decoder). Each gives
transformers' image features (``get_image_features``) and its logits with one and with two
images in the prompt through the reference interpreter and, cut into vision / embedding /
decoder models, both ONNX targets (<= 1e-4 relative); the ONNX folders generate
transformers' 16 greedy tokens with an image in irc's loop and, for Gemma 3, in
onnxruntime-genai 0.18; ``irc run --image`` answers; bad prompts and configs are one error
naming the key."""
import json
import os

import numpy as np
import pytest

from frontends import load_spec
from irc.check import relative_error
from irc.errors import SpecError
from irc.interpreter import run
from irc_cli import main
from tests.frontends.twin_fixtures import once_fixture
from tests.frontends.vlm_checks import assert_features_and_logits_match, assert_folder_matches, folder_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4
IMAGE_TOKEN, BOI, EOI = 100, 101, 102
TOWER = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, image_size=16,
             patch_size=4)
TEXT = dict(vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)
OPT_TEXT = dict(vocab_size=128, hidden_size=48, ffn_dim=96, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=256, word_embed_proj_dim=48)
GEMMA3_TEXT = dict(TEXT, num_hidden_layers=3, head_dim=16, sliding_window=6,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"])
CASES = {  # name: (model class, config class, vision config class, text config, config overrides)
    "llava-clip": ("LlavaForConditionalGeneration", "LlavaConfig", "CLIPVisionConfig", ("LlamaConfig", TEXT), {}),
    "llava-siglip-qwen2": ("LlavaForConditionalGeneration", "LlavaConfig", "SiglipVisionConfig",
                           ("Qwen2Config", TEXT),
                           dict(vision_feature_layer=[-3, -1], vision_feature_select_strategy="full",
                                multimodal_projector_bias=False, projector_hidden_act="gelu_pytorch_tanh")),
    "gemma3": ("Gemma3ForConditionalGeneration", "Gemma3Config", "SiglipVisionConfig", ("Gemma3TextConfig", GEMMA3_TEXT),
               dict(image_size=32, boi_token_index=BOI, eoi_token_index=EOI, mm_tokens_per_image=16)),
    # 32 pixels in patches of 4: 8 x 8, shuffled by 2 into 16 tokens of 4·32 features
    "smolvlm": ("SmolVLMForConditionalGeneration", "SmolVLMConfig", "SmolVLMVisionConfig", ("LlamaConfig", TEXT),
                dict(image_size=32, scale_factor=2)),
    "idefics3": ("Idefics3ForConditionalGeneration", "Idefics3Config", "Idefics3VisionConfig", ("LlamaConfig", TEXT),
                 dict(image_size=16, scale_factor=4)),
    # the image's 16 tokens first, then the prompt: all of it one bidirectional prefix
    "paligemma": ("PaliGemmaForConditionalGeneration", "PaliGemmaConfig", "SiglipVisionConfig",
                  ("GemmaConfig", dict(TEXT, head_dim=12)), dict(projection_dim=48)),
    "blip-2": ("Blip2ForConditionalGeneration", "Blip2Config", "Blip2VisionConfig", ("OPTConfig", OPT_TEXT),
               dict(num_query_tokens=8, qformer_config=dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                                            intermediate_size=40))),
}


def build(name: str, folder):
    model_class, config_class, vision, (text, text_kwargs), overrides = CASES[name]
    overrides = dict(overrides)
    size = overrides.pop("image_size", TOWER["image_size"])
    token = {"image_token_id" if model_class.startswith(("SmolVLM", "Idefics3")) else "image_token_index": IMAGE_TOKEN}
    config = getattr(transformers, config_class)(
        vision_config=getattr(transformers, vision)(**{**TOWER, "image_size": size}).to_dict(),
        text_config=getattr(transformers, text)(**text_kwargs).to_dict(), **token, **overrides)
    model = randomized(getattr(transformers, model_class)(config).eval(), sorted(CASES).index(name))
    model.save_pretrained(folder)
    return model, str(folder)


def randomized(model, seed: int):
    """``model`` with seeded weights of a size that keeps activations near 1 (biases and norms
    0.5, matrices 1/sqrt(fan-in)), so a twin's outputs are well away from zero."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * (0.5 if p.ndim == 1 else p.shape[-1] ** -0.5))
    return model


twins = once_fixture(build, "twins")


def tokens_per_image(model) -> int:
    cfg = model.config
    if cfg.model_type == "gemma3":
        return cfg.mm_tokens_per_image
    if cfg.model_type in ("smolvlm", "idefics3"):
        return (cfg.vision_config.image_size // cfg.vision_config.patch_size // cfg.scale_factor) ** 2
    if cfg.model_type == "paligemma":
        return (cfg.vision_config.image_size // cfg.vision_config.patch_size) ** 2
    if cfg.model_type == "blip-2":
        return cfg.num_query_tokens
    patches = (cfg.vision_config.image_size // cfg.vision_config.patch_size) ** 2
    return patches + (1 if "CLIP" in type(cfg.vision_config).__name__ else 0) - (
        cfg.vision_feature_select_strategy == "default")


def prompt(model, images: int) -> np.ndarray:
    """Text, then per image its tokens (Gemma 3: between <start_of_image> and <end_of_image>)."""
    rng = np.random.default_rng(images)
    gemma = model.config.model_type == "gemma3"
    if model.config.model_type == "paligemma":  # PaliGemmaProcessor: the images' tokens, <bos>, the prompt
        return np.asarray([[IMAGE_TOKEN] * (tokens_per_image(model) * images) + [2] +
                           list(rng.integers(3, IMAGE_TOKEN, 7))], np.int64)
    ids = [2 if gemma else 1]
    for _ in range(images):
        image = [IMAGE_TOKEN] * tokens_per_image(model)
        ids += list(rng.integers(3, IMAGE_TOKEN, 3)) + ([BOI] + image + [EOI] if gemma else image)
    return np.asarray([ids + list(rng.integers(3, IMAGE_TOKEN, 4))], np.int64)


def pixels(model, images: int) -> np.ndarray:
    size = model.config.vision_config.image_size
    return np.random.default_rng(10 + images).standard_normal((images, 3, size, size)).astype(np.float32)


def hf_pixels(model, pixel_values):
    """pixel_values as the model takes them: Idefics3 and SmolVLM [B, images, C, H, W]."""
    tensor = torch.from_numpy(pixel_values)
    return tensor[None] if model.config.model_type in ("smolvlm", "idefics3") else tensor


def extra(model, ids) -> dict:
    """Gemma 3's ``token_type_ids`` (1 on image tokens) and PaliGemma's (0 on the prefix: the
    whole prompt), as their processors give them."""
    if model.config.model_type == "paligemma":
        return {"token_type_ids": torch.zeros(ids.shape, dtype=torch.long)}
    if model.config.model_type != "gemma3":
        return {}
    return {"token_type_ids": torch.from_numpy((ids == IMAGE_TOKEN).astype(np.int64))}


def reference(model, ids, pixel_values):
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(ids), pixel_values=hf_pixels(model, pixel_values),
                       **extra(model, ids)).logits
        features = torch.cat(list(model.get_image_features(hf_pixels(model, pixel_values)).pooler_output))
    return features.numpy(), logits.numpy()


def decoder_feeds(graph, ids, features) -> dict:
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None], "image_features": features}
    for value in graph.inputs:
        if value.name.startswith("past_key_values."):
            feeds[value.name] = np.zeros((1, value.shape[1], 0, value.shape[3]), np.float32)
    return feeds


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("images", [1, 2])
def test_interpreter_matches_transformers(twins, name, images):
    model, folder = twins(name)
    graph = load_spec(folder)
    ids, pixel_values = prompt(model, images), pixels(model, images)
    want_features, want_logits = reference(model, ids, pixel_values)
    assert_features_and_logits_match(graph, {"pixel_values": pixel_values},
                                     lambda features: decoder_feeds(graph, ids, features), want_features, want_logits)


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_folder_matches_transformers(twins, tmp_path, name, target):
    model, folder = twins(name)
    vlm = folder_model(folder, tmp_path, target)
    assert sorted(p.name for p in (tmp_path / "out").glob("*.onnx")) == ["embedding.onnx", "model.onnx", "vision.onnx"]
    assert [v.name for v in vlm.decoder.get_inputs()][0] == "inputs_embeds"
    # Gemma 3's and PaliGemma's decoders read the ids too: the image blocks of their masks
    assert ("input_ids" in {v.name for v in vlm.decoder.get_inputs()}) == (name in ("gemma3", "paligemma"))
    ids, pixel_values = prompt(model, 2), pixels(model, 2)
    want_features, want_logits = reference(model, ids, pixel_values)
    assert_folder_matches(vlm, load_spec(folder), decoder_feeds, ids, vlm.features(pixel_values), want_features,
                          want_logits)
    # a text-only step: no image rows at all
    text = vlm.embedding.run(None, {"input_ids": ids[:, :1], "image_features": np.zeros((0, 48), np.float32)})[0]
    assert text.shape == (1, 1, 48)


class Clock:
    """A runner's clock that keeps nothing (``irc_cli.run.Clock`` streams and times)."""

    def start(self):
        pass

    def token(self, token):
        pass


@pytest.mark.parametrize("name", ["llava-clip", "gemma3", "blip-2"])
def test_onnx_folder_generates_transformers_tokens(twins, tmp_path, name):
    """irc's loop over the three models, and onnxruntime-genai 0.18 where it runs the type
    (gemma3: the folder's genai_config.json), give transformers' 16 greedy tokens."""
    from irc_cli.run_vlm import FolderModel, runner

    model, folder = twins(name)
    if name == "gemma3":
        transformers.Gemma3ImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(folder)
    out = tmp_path / "out"
    assert main(["compile", folder, "--target", "onnx-ort", "-o", str(out / "model.onnx"), "--quiet"]) == 0
    ids, pixel_values = prompt(model, 1), pixels(model, 1)
    with torch.no_grad():
        want = model.generate(input_ids=torch.from_numpy(ids), pixel_values=hf_pixels(model, pixel_values),
                              attention_mask=torch.ones_like(torch.from_numpy(ids)), max_new_tokens=16,
                              min_new_tokens=16, do_sample=False, **extra(model, ids))[0, ids.shape[1]:].tolist()
    vlm = FolderModel(str(out))
    engines = ["ort"] + (["genai"] if name == "gemma3" else [])
    assert (out / "genai_config.json").exists() == (name == "gemma3")
    for engine in engines:
        if engine == "genai":
            pytest.importorskip("onnxruntime_genai")
        got = runner(vlm, pixel_values)(str(out), ids[0].tolist(), 16, set(), Clock(), engine=engine)
        assert got.tokens == want, engine


@pytest.mark.parametrize("name", ["llava-clip", "gemma3"])
def test_irc_run_with_an_image(twins, tmp_path, capsys, name):
    """``irc run`` on the HF folder (interpreter) and on its ONNX folder (irc's loop; for
    Gemma 3 also onnxruntime-genai): the same tokens; the placeholder the user writes (LLaVA's
    <image>, Gemma 3's <start_of_image>) is laid out as the processor lays it out."""
    from PIL import Image

    model, folder = twins(name)
    size = model.config.vision_config.image_size
    if name == "gemma3":
        transformers.Gemma3ImageProcessorPil(size={"height": size, "width": size}).save_pretrained(folder)
    else:
        transformers.CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size}
                                        ).save_pretrained(folder)
    placeholder = BOI if name == "gemma3" else IMAGE_TOKEN
    image = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(3).random((20, 24, 3)) * 255).astype(np.uint8)).save(image)
    out = tmp_path / "out"
    assert main(["compile", folder, "--target", "onnx", "-o", str(out / "model.onnx"), "--quiet"]) == 0
    answers = {}
    engines = ["auto", "ort", "genai"] if name == "gemma3" else ["auto"]
    for source, engine in [(folder, "auto")] + [(str(out), e) for e in engines]:
        if engine == "genai":
            pytest.importorskip("onnxruntime_genai")
        assert main(["run", source, "--image", str(image), "--prompt-ids", f"2,7,{placeholder},9", "--engine", engine,
                     "--max-new-tokens", "6", "--json", "--quiet"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["prompt_tokens"].count(IMAGE_TOKEN) == tokens_per_image(model)
        if name == "gemma3":
            assert report["prompt_tokens"][2:4] == [BOI, IMAGE_TOKEN] and EOI in report["prompt_tokens"]
        answers[(source, engine)] = report["tokens"]
    assert len(set(map(tuple, answers.values()))) == 1 and len(answers[(folder, "auto")]) == 6, answers
    # two placeholders for one image: refused before anything runs
    assert main(["run", str(out), "--image", str(image), "--prompt-ids", f"1,{placeholder},{placeholder}"]) == 2
    assert "2 image placeholder(s)" in capsys.readouterr().err


def changed_config(folder, target, changes: dict) -> str:
    """``target`` holding ``folder``'s config.json with ``changes`` made ("key" or
    "sub_config.key" -> value): a config to refuse."""
    data = json.loads(open(os.path.join(folder, "config.json")).read())
    for key, value in changes.items():
        outer, _, inner = key.partition(".")
        if inner:
            data[outer][inner] = value
        else:
            data[outer] = value
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, "config.json"), "w") as f:
        f.write(json.dumps(data, indent=2))
    return str(target)


def _config(tmp_path, twins, **changes) -> str:
    return changed_config(twins("llava-clip")[1], tmp_path / "bad", changes)


@pytest.mark.parametrize("changes, key", [
    ({"vision_feature_layer": -5}, "vision_feature_layer"),
    ({"vision_feature_select_strategy": "cls"}, "vision_feature_select_strategy"),
    ({"projector_hidden_act": "relu"}, "projector_hidden_act"),
    ({"vision_config.model_type": "dinov2"}, "vision_config.model_type"),
    ({"image_token_index": 500}, "image_token_index"),
])
def test_config_mistakes_name_the_key(twins, tmp_path, changes, key):
    with pytest.raises(SpecError) as err:
        load_spec(_config(tmp_path, twins, **changes))
    assert key in str(err.value)


EXAMPLES = {"llava-1.5-7b": "LlavaForConditionalGeneration", "gemma-3-4b": "Gemma3ForConditionalGeneration",
            "llava-v1.6-mistral-7b": "LlavaNextForConditionalGeneration",
            "mistral-small-3.1-24b": "Mistral3ForConditionalGeneration",
            "smolvlm-256m": "Idefics3ForConditionalGeneration", "paligemma-3b-224": "PaliGemmaForConditionalGeneration",
            "llama-3.2-11b-vision": "MllamaForConditionalGeneration"}
TOKENS = {"llava-1.5-7b": 576, "gemma-3-4b": 256, "smolvlm-256m": 64, "paligemma-3b-224": 256,
          "llava-v1.6-mistral-7b": 576, "mistral-small-3.1-24b": 3025, "llama-3.2-11b-vision": 4 * 1601}  # SmolVLM's and LLaVA-NeXT's per tile;
# Mistral-3's at its image_size, 1,540 x 1,540 pixels: 55 x 55 merged blocks (images are any size)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_full_size_examples_count_transformers_parameters(name):
    """LLaVA-1.5-7B, Gemma-3-4B, SmolVLM-256M and PaliGemma-3B (examples/hf/NAME, config.json
    alone) built by transformers on the meta device: irc's decoder and vision model hold its
    parameters, less the tower's that no output reads (LLaVA reads hidden_states[-2]: CLIP's
    last layer and post-LayerNorm)."""
    from irc.analysis import analyze

    folder = f"{os.path.dirname(__file__)}/../../examples/hf/{name}"
    config = transformers.AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = getattr(transformers, EXAMPLES[name])(config)
    last = config.vision_config.num_hidden_layers - 1
    unread = (f"encoder.layers.{last}.", "post_layernorm.") if name.startswith("llava") else ()
    held = sum(p.numel() for n, p in model.named_parameters() if not any(u in n for u in unread))
    graph = load_spec(folder)
    vision = analyze(graph.parts["vision"])
    assert analyze(graph)["params_total"] + vision["params_total"] == held
    assert vision["vision"]["tokens"] == TOKENS[name]


def test_show_prices_llava_images_against_the_prompt(capsys):
    """The seeds' case: LLaVA-1.5-7B's 576 visual tokens against a 20-token question, at
    fp16 (512 KiB of KV cache a token over 32 layers): 288 MiB an image, 96.6% of the cache."""
    folder = f"{os.path.dirname(__file__)}/../../examples/hf/llava-1.5-7b"
    assert main(["show", folder, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    costs = summary["visual_tokens"]
    assert (costs["image_tokens"], costs["kv_bytes_per_token"]) == (576, 32 * 2 * 4096 * 2)
    assert costs["image_kv_bytes"] == 288 << 20
    assert costs["against_prompt"][0] == {"prompt_tokens": 20, "prompt_kv_bytes": 20 * 524288, "image_share": 0.9664}
    assert summary["vision_model"]["vision"]["tokens"] == 576


def test_the_dsl_declares_llava():
    """examples/llava_1_5_7b_dsl.py builds the HF example's decoder and vision model."""
    from tests.frontends.test_yaml_vision import without_meta

    folder = f"{os.path.dirname(__file__)}/../../examples"
    dsl, hf = load_spec(f"{folder}/llava_1_5_7b_dsl.py"), load_spec(f"{folder}/hf/llava-1.5-7b")
    assert without_meta(dsl) == without_meta(hf)
    assert without_meta(dsl.parts["vision"]) == without_meta(hf.parts["vision"])


LAYOUTS = {  # how else a checkpoint names the twin's tensors (transformers 5.25 saves 4.x's names,
    # with the tower's vision_model. level left out): prefix as saved -> prefix in that layout
    "hub-4.x": [("vision_tower.", "vision_tower.vision_model.")],  # llava-hf's, Google's Gemma 3
    "in-memory-5.x": [("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
                      ("vision_tower.", "model.vision_tower."),
                      ("multi_modal_projector.", "model.multi_modal_projector.")],
}


def relaid(folder, target, layout: str) -> str:
    """The twin's folder with its tensors renamed to ``layout``'s names."""
    import shutil

    from safetensors.numpy import load_file, save_file

    renamed = {}
    for name, value in load_file(os.path.join(folder, "model.safetensors")).items():
        old, new = next(((old, new) for old, new in LAYOUTS[layout] if name.startswith(old)), (name, name))
        renamed[new + name[len(old):]] = value
    os.makedirs(target)
    shutil.copy(os.path.join(folder, "config.json"), target)
    save_file(renamed, os.path.join(target, "model.safetensors"))
    return str(target)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", sorted(set(CASES) - {"blip-2"}))  # BLIP-2's hub and 5.x names are one
def test_other_checkpoint_layouts_give_the_same_model(twins, tmp_path, name, layout):
    model, folder = twins(name)
    other, saved = load_spec(relaid(folder, tmp_path / layout, layout)), load_spec(folder)
    ids, pixel_values = prompt(model, 1), pixels(model, 1)
    features = [run(g.parts["vision"], {"pixel_values": pixel_values})["image_features"] for g in (other, saved)]
    np.testing.assert_array_equal(features[0], features[1])
    logits = [run(g, decoder_feeds(g, ids, features[0]))["logits"] for g in (other, saved)]
    np.testing.assert_array_equal(logits[0], logits[1])


def tiny_tokenizer(folder, vocab: int = 128):
    """A word-level tokenizer.json whose ids fit the twin: words, the tile markers and SmolVLM's
    image strings (``<image>`` = IMAGE_TOKEN) as added tokens, a newline one too."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    special = ["<fake_token_around_image>", "<global-img>", "<end_of_utterance>"] + [
        f"<row_{r}_col_{c}>" for r in range(1, 5) for c in range(1, 5)]
    words = ["<unk>"] + [f"w{i}" for i in range(IMAGE_TOKEN - 1)]
    table = {word: i for i, word in enumerate(words)}
    table["<image>"] = IMAGE_TOKEN
    table.update({token: IMAGE_TOKEN + 1 + i for i, token in enumerate(special + ["\n"])})
    assert max(table.values()) < vocab
    tokenizer = Tokenizer(models.WordLevel(table, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken(t, normalized=False) for t in ["<image>"] + special])
    tokenizer.add_tokens([AddedToken("\n", normalized=False)])
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    return transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"),
                                                unk_token="<unk>")


@pytest.mark.parametrize("size", [(20, 24), (40, 100)])
def test_irc_run_lays_smolvlm_tiles_out_as_its_processor(twins, tmp_path, capsys, size):
    """A 20 x 24 image (resized to 54 x 64, then 64 x 64: 2 x 2 tiles of 32 and the global
    view) and a 40 x 100 one (26 x 64, then 32 x 64: 1 x 2 tiles and the global view): ``irc
    run --prompt`` gives the processor's ids and transformers' greedy tokens, from the HF
    folder and from the ONNX folder."""
    from PIL import Image

    model, folder = twins("smolvlm")
    # Idefics3's processor: SmolVLM's lays images out the same way, but needs torchvision for video
    image_processor = transformers.Idefics3ImageProcessorPil(size={"longest_edge": 64},
                                                             max_image_size={"longest_edge": 32})
    image_processor.save_pretrained(folder)
    tokenizer = tiny_tokenizer(folder)
    processor = transformers.Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer,
                                               image_seq_len=tokens_per_image(model))
    image = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(4).random((*size, 3)) * 255).astype(np.uint8)).save(image)
    text = "w5 w9 <image> w7 w8"
    inputs = processor(text=text, images=[[Image.open(image).convert("RGB")]], return_tensors="pt")
    with torch.no_grad():
        want = model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    want = want[0, inputs["input_ids"].shape[1]:].tolist()
    out = tmp_path / "out"
    assert main(["compile", folder, "--target", "onnx-ort", "-o", str(out / "model.onnx"), "--quiet"]) == 0
    for source in (folder, str(out)):
        assert main(["run", source, "--image", str(image), "--prompt", text, "--max-new-tokens", "6", "--json",
                     "--quiet"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["prompt_tokens"] == inputs["input_ids"][0].tolist()
        assert report["tokens"] == want
    assert main(["run", str(out), "--image", str(image), "--prompt-ids", f"1,{IMAGE_TOKEN},9"]) == 2
    assert "names its tiles in text" in capsys.readouterr().err


def test_quantize_reports_its_error_on_the_image_features(twins, tmp_path, capsys):
    """--quantize int4 --check: the vision model is quantized too (its tower and projector), and
    its check names what the codes move its output, the image features, by."""
    import re

    _, folder = twins("llava-clip")
    out = tmp_path / "out" / "model.onnx"
    assert main(["compile", folder, "--target", "onnx-ort", "--quantize", "int4", "--check", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "vision model: quantize: int4 codes" in err
    moved = re.search(r"vision model: check reported: quantize moves the outputs by (\S+) ", err)
    assert moved and 0 < float(moved.group(1)) < 0.5, err
    assert "vision model: check passed: 4 exact pass(es)" in err


def test_the_yaml_form_declares_llava():
    """examples/llava-1.5-7b.yaml builds the HF example's decoder and vision model."""
    from tests.frontends.test_yaml_vision import without_meta

    folder = f"{os.path.dirname(__file__)}/../../examples"
    yaml, hf = load_spec(f"{folder}/llava-1.5-7b.yaml"), load_spec(f"{folder}/hf/llava-1.5-7b")
    assert without_meta(yaml) == without_meta(hf)
    assert without_meta(yaml.parts["vision"]) == without_meta(hf.parts["vision"])


@pytest.mark.parametrize("change, key", [
    ({"layer": -30}, "layer"), ({"pool_tokens": 7}, "pool_tokens"), ({"projector": "perceiver"}, "projector"),
    ({"projector": "qformer"}, "projector"),  # a Q-Former needs settings the YAML form does not declare
    ({"shape": 1}, "shape"),
])
def test_yaml_vlm_mistakes_name_the_key(change, key):
    import yaml as pyyaml

    from frontends.yaml_spec import loads

    path = f"{os.path.dirname(__file__)}/../../examples/llava-1.5-7b.yaml"
    data = pyyaml.safe_load(open(path))
    data["model"]["image_input"]["vision_model"]["features"].update(change)
    with pytest.raises(SpecError) as err:
        loads(pyyaml.safe_dump(data), "vlm.yaml")
    assert key in str(err.value) and "vlm.yaml" in str(err.value)


@pytest.mark.parametrize("target", ["numpy", "triton", "onnx-npu"])
def test_one_model_targets_refuse_a_vlm_by_name(tmp_path, capsys, target):
    """A VLM is a vision model beside its decoder: the targets that write one model say so,
    exit 2, and write nothing."""
    spec = f"{os.path.dirname(__file__)}/../../examples/tiny-llava-1.5-7b.yaml"
    out = tmp_path / "out"
    assert main(["compile", spec, "--target", target, "-o", str(out / "model.x")]) == 2
    err = capsys.readouterr().err
    assert f"--target {target} writes one model, and this VLM has a vision model" in err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("name", ["paligemma", "blip-2"])
def test_irc_run_puts_the_image_before_the_prompt(twins, tmp_path, capsys, name):
    """PaliGemma's and Blip2Processor write the image's tokens before the prompt (no
    placeholder in it): ``irc run --prompt-ids`` gives transformers' greedy tokens from the HF
    folder and the ONNX folder, the pixels through the checkpoint's processor (BLIP's: bicubic,
    CLIP's mean and std)."""
    from PIL import Image

    model, folder = twins(name)
    processor = transformers.SiglipImageProcessor if name == "paligemma" else transformers.BlipImageProcessor
    processor(size={"height": 16, "width": 16}).save_pretrained(folder)
    image = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(5).random((30, 20, 3)) * 255).astype(np.uint8)).save(image)
    from irc_cli.images import Processor
    pixel_values = Processor.read(folder).images(Image.open(image))[0]
    ids = np.asarray([[IMAGE_TOKEN] * tokens_per_image(model) + [2, 7, 9]], np.int64)
    with torch.no_grad():
        want = model.generate(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixel_values),
                              attention_mask=torch.ones(ids.shape, dtype=torch.long), max_new_tokens=6,
                              min_new_tokens=6, do_sample=False, **extra(model, ids))[0, ids.shape[1]:].tolist()
    out = tmp_path / "out"
    assert main(["compile", folder, "--target", "onnx-ort", "-o", str(out / "model.onnx"), "--quiet"]) == 0
    for source in (folder, str(out)):
        assert main(["run", source, "--image", str(image), "--prompt-ids", "2,7,9", "--max-new-tokens", "6",
                     "--json", "--quiet"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["prompt_tokens"] == ids[0].tolist() and report["tokens"] == want


def test_blip2_reads_the_hubs_q_and_v_biases(twins, tmp_path):
    """The hub's BLIP-2 ViT keeps ``q_bias`` and ``v_bias`` (the key's bias is zero);
    transformers 5 saves the fused ``qkv.bias``. The twin with a zero key bias, saved both ways,
    is one model."""
    from safetensors.numpy import load_file, save_file

    model, folder = twins("blip-2")
    fused, hub = load_file(os.path.join(folder, "model.safetensors")), {}
    for name, value in fused.items():
        if name.endswith("self_attn.qkv.bias"):
            d = value.shape[0] // 3
            value[d:2 * d] = 0
            hub[name.replace("qkv.bias", "q_bias")], hub[name.replace("qkv.bias", "v_bias")] = value[:d], value[2 * d:]
        else:
            hub[name] = value
    graphs = []
    for layout, tensors in (("fused", fused), ("hub", hub)):
        target = tmp_path / layout / os.path.basename(folder)
        target.mkdir(parents=True)
        (target / "config.json").write_text(open(os.path.join(folder, "config.json")).read())
        save_file(tensors, str(target / "model.safetensors"))
        graphs.append(load_spec(str(target)))
    pixel_values = pixels(model, 1)
    features = [run(g.parts["vision"], {"pixel_values": pixel_values})["image_features"] for g in graphs]
    np.testing.assert_array_equal(features[0], features[1])


@pytest.mark.parametrize("change, key", [
    ({"qformer_config": {"hidden_act": "relu"}}, "qformer_config.hidden_act"),
    ({"text_config": {"model_type": "t5"}}, "text_config.model_type"),  # Flan-T5's BLIP-2s: an encoder-decoder
])
def test_blip2_config_mistakes_name_the_key(twins, tmp_path, capsys, change, key):
    _, folder = twins("blip-2")
    changes = {f"{outer}.{key}": value for outer, inner in change.items() for key, value in inner.items()}
    bad = changed_config(folder, tmp_path, changes)
    assert main(["show", bad]) == 2
    assert key in capsys.readouterr().err


def test_a_vlm_folder_is_byte_identical_compiled_twice(twins, tmp_path):
    """The three models, genai_config.json, processor_config.json and irc_vlm.json."""
    model, folder = twins("gemma3")
    transformers.Gemma3ImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(folder)
    for copy in ("a", "b"):
        assert main(["compile", folder, "--target", "onnx-ort", "-o", str(tmp_path / copy / "model.onnx"),
                     "--quiet"]) == 0
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert {"vision.onnx", "embedding.onnx", "model.onnx", "genai_config.json", "processor_config.json",
            "irc_vlm.json"} <= set(names)
    assert all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes() for n in names)


def test_irc_tile_plans_the_decoder_and_the_vision_model(tmp_path, capsys):
    """``irc tile`` on a VLM: the decoder's prefill and decode (image rows not counted there)
    and the vision model's image phase, each written, each op run by the tiled executor with
    the planned DRAM bytes and the reference's numbers."""
    from backends.npu.executor import execute, reference
    from backends.npu.operands import random_operands
    from passes.npu_tile.plan import machine_of

    spec = f"{os.path.dirname(__file__)}/../../examples/tiny-llava-1.5-7b.yaml"
    target = f"{os.path.dirname(__file__)}/../../examples/targets/edge-npu.yaml"
    assert main(["tile", spec, "--target-npu", target, "-o", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    assert "prefill" in out and "decode" in out and "image" in out and "16 tokens an image" in out
    decoder = json.loads((tmp_path / "plan.json").read_text())
    vision = json.loads((tmp_path / "plan.vision.json").read_text())
    assert set(decoder["phases"]) == {"prefill", "decode"} and set(vision["phases"]) == {"image"}
    for plan in (decoder, vision):
        machine = machine_of(plan)
        for record in plan["ops"]:
            operands, numbers = random_operands(record, machine, seed=3)
            result = execute(record, machine, operands, numbers)
            assert result.dram == record["dram"], record["name"]
            if record["kind"] == "gemm":
                np.testing.assert_array_equal(result.outputs, reference(record, machine, operands, numbers))


def test_the_yaml_vlm_compiles_and_reports(tmp_path, capsys):
    """A YAML VLM through irc compile (with its report) and irc run on its folder: its prompt
    layout is the DSL's default, LLaVA's placeholder widened to the image's tokens."""
    spec = f"{os.path.dirname(__file__)}/../../examples/tiny-llava-1.5-7b.yaml"
    out = tmp_path / "out"
    assert main(["compile", spec, "--target", "onnx", "-o", str(out / "model.onnx"), "--report",
                 str(tmp_path / "report.html"), "--quiet"]) == 0
    manifest = json.loads((out / "irc_vlm.json").read_text())
    assert manifest["image_prompt"]["kind"] == "repeat" and manifest["image_tokens"] == 16
    assert (tmp_path / "report.html").stat().st_size > 0
    assert main(["run", str(out), "--prompt-ids", "1,5,6", "--max-new-tokens", "3", "--json", "--quiet"]) == 0
    assert len(json.loads(capsys.readouterr().out)["tokens"]) == 3


def test_an_fp16_folder_runs_with_an_image(twins, tmp_path, capsys):
    """--dtype f16: the vision model takes f16 pixels (its position table added in f32 beside
    activations lowered in f32 loads in ORT), its features are within fp16's rounding of the
    f32 model's, and irc run feeds each model its own types."""
    from irc_cli.run_vlm import FolderModel

    model, folder = twins("llava-clip")
    transformers.CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}
                                    ).save_pretrained(folder)
    for dtype in ("f32", "f16"):
        assert main(["compile", folder, "--target", "onnx-ort", "--dtype", dtype, "-o",
                     str(tmp_path / dtype / "model.onnx"), "--quiet"]) == 0
    pixel_values = pixels(model, 1)
    full, half = (FolderModel(str(tmp_path / d)).features(pixel_values) for d in ("f32", "f16"))
    assert half.dtype == np.float16 and relative_error(half.astype(np.float32), full) <= 1e-2
    from PIL import Image
    image = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(6).random((20, 24, 3)) * 255).astype(np.uint8)).save(image)
    assert main(["run", str(tmp_path / "f16"), "--image", str(image), "--prompt-ids", f"1,{IMAGE_TOKEN},9",
                 "--max-new-tokens", "4", "--json", "--quiet"]) == 0
    assert len(json.loads(capsys.readouterr().out)["tokens"]) == 4


def bpe_tokenizer(folder) -> None:
    """A tokenizer onnxruntime-extensions loads (BPE, no merges: whole words), Gemma 3's image
    strings as special tokens with the twin's ids."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, IMAGE_TOKEN)}, "<image_soft_token>": IMAGE_TOKEN,
             "<start_of_image>": BOI, "<end_of_image>": EOI}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken(t, normalized=False) for t in list(vocab)[IMAGE_TOKEN:]])
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GemmaTokenizer", "unk_token": "<unk>", "bos_token": "w1", "eos_token": "w2",
                   "pad_token": "<unk>", "add_bos_token": False, "add_eos_token": False}, f)


def test_genai_reads_an_image_file_through_the_folders_processor(twins, tmp_path):
    """onnxruntime-genai 0.18's own image path for Gemma 3: the file through the folder's
    processor_config.json gives transformers' processor's pixel values, channels in RGB order
    (0.18's ConvertRGB step would swap red and blue: irc's config leaves it out). genai's Gemma
    3 processor writes 256 soft tokens an image (the checkpoints' count; the twin has 16), so
    the twin is not generated from here."""
    og = pytest.importorskip("onnxruntime_genai")
    from PIL import Image

    _, folder = twins("gemma3")
    processor = transformers.Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    processor.save_pretrained(folder)
    out = tmp_path / "out"
    assert main(["compile", folder, "--target", "onnx-ort", "-o", str(out / "model.onnx"), "--quiet"]) == 0
    steps = json.loads((out / "processor_config.json").read_text())["processor"]["transforms"]
    assert "ConvertRGB" not in [step["operation"]["type"] for step in steps]
    bpe_tokenizer(str(out))
    pixels = np.zeros((32, 32, 3), np.uint8)
    pixels[..., 0], pixels[..., 1], pixels[..., 2] = 250, 10, 120  # a channel swap would show
    pixels[8:20, 4:30] = np.random.default_rng(4).integers(0, 256, (12, 26, 3))
    image = tmp_path / "photo.png"
    Image.fromarray(pixels).save(image)
    inputs = og.Model(str(out)).create_multimodal_processor()("<start_of_image>", images=og.Images.open(str(image)))
    want = processor(Image.open(image), return_tensors="np")["pixel_values"]
    assert np.abs(inputs["pixel_values"].as_numpy() - want).max() <= 1e-5
