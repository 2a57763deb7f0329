"""Qwen2-VL, Qwen2.5-VL and Qwen3.5 (dense and MoE; ``frontends.hf.vlm_qwen``) against
transformers 5.25 on tiny random twins: flattened patches of images of any size
(``image_grid_thw``), 2-D RoPE in the tower, Qwen2.5-VL's window attention (windows of 2 x 2
merged blocks, one full-attention layer), Qwen3.5's learned 4 x 4 position grid resampled to
each image, the patch merger, and the text model's multimodal RoPE (``irc.mrope``: three
position axes; sections for the Qwen2-VLs, interleaved over a partial rotary width in Qwen3.5's
hybrid of gated-DeltaNet and attention layers).
Each gives transformers' image features and its logits with one and with two images (of
different sizes), and on a left-padded batch, through the reference interpreter and, cut into
vision / embedding / decoder models, both ONNX targets (<= 1e-4 relative); the folder
generates transformers' 16 greedy tokens in irc's loop; ``irc run --image`` makes the
processor's patches and lays the prompt out as Qwen2VLProcessor does; bad configs name the
key."""
import json
import os

import numpy as np
import pytest

from frontends import load_spec
from irc.check import relative_error
from irc.interpreter import run
from irc.mrope import mrope_positions
from backends.onnx.vlm import GENAI_TYPES
from irc_cli import main
from tests.frontends.test_hf_models import built_once
from tests.frontends.test_hf_vlm import Clock, changed_config, randomized

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4
IMAGE, VIDEO, START, END = 150, 151, 152, 153
TEXT = dict(vocab_size=160, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=159,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 2, 2]})
# Qwen3.5's hybrid: DeltaNet, gated attention (12 of 16 dims rotating, 6 pairs over 3 axes), DeltaNet
QWEN3_TEXT = dict(TEXT, head_dim=16, num_hidden_layers=3, layer_types=["linear_attention", "full_attention",
                                                                       "linear_attention"],
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 2, 2],
                                   "mrope_interleaved": True, "partial_rotary_factor": 0.75})
QWEN3_TOWER = dict(depth=2, hidden_size=32, intermediate_size=40, num_heads=4, out_hidden_size=48, patch_size=4,
                   spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16)
TOWERS = {
    "qwen2_5_vl": dict(depth=3, hidden_size=32, intermediate_size=40, num_heads=4, out_hidden_size=48, patch_size=4,
                       window_size=16, fullatt_block_indexes=[1], spatial_merge_size=2, temporal_patch_size=2),
    "qwen2_vl": dict(depth=3, embed_dim=32, hidden_size=48, num_heads=4, mlp_ratio=2, patch_size=4,
                     spatial_merge_size=2, temporal_patch_size=2),
    "qwen3_5": QWEN3_TOWER, "qwen3_5_moe": QWEN3_TOWER,
    # DeepStack from the last and the first of three layers (out of order, as a config may list them)
    "qwen3_vl": dict(QWEN3_TOWER, depth=3, deepstack_visual_indexes=[2, 0]),
    "qwen3_vl_moe": dict(QWEN3_TOWER, deepstack_visual_indexes=[1]),
}
TEXTS = {"qwen3_vl": dict(TEXT, head_dim=12, num_hidden_layers=3,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 2, 2],
                                           "mrope_interleaved": True}),
         "qwen3_vl_moe": dict(TEXT, head_dim=12, num_hidden_layers=2, num_experts=4, num_experts_per_tok=2,
                              moe_intermediate_size=16, decoder_sparse_step=1,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                               "mrope_section": [2, 2, 2], "mrope_interleaved": True}),
         "qwen3_5": QWEN3_TEXT, "qwen3_5_moe": dict(QWEN3_TEXT, num_experts=4, num_experts_per_tok=2,
                                                    moe_intermediate_size=16, shared_expert_intermediate_size=24)}
CLASSES = {"qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration"),
           "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration"),
           "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration"),
           "qwen3_vl_moe": ("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration"),
           "qwen3_5": ("Qwen3_5Config", "Qwen3_5ForConditionalGeneration"),
           "qwen3_5_moe": ("Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration")}
GRIDS = np.array([[1, 8, 12], [1, 4, 8]])  # a 32 x 48 and a 16 x 32 image in patches of 4: 24 and 8 tokens
PROCESSOR = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 4, "merge_size": 2,
             "temporal_patch_size": 2, "min_pixels": 256, "max_pixels": 2048}


def build(name: str, folder):
    config_class, model_class = CLASSES[name]
    config = getattr(transformers, config_class)(text_config=TEXTS.get(name, TEXT), vision_config=TOWERS[name],
                                                  image_token_id=IMAGE, video_token_id=VIDEO,
                                                  vision_start_token_id=START, vision_end_token_id=END)
    model = getattr(transformers, model_class)._from_config(config, attn_implementation="eager")
    model = randomized(model.eval(), sorted(CLASSES).index(name))
    model.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    return model, str(folder)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    return built_once(build, tmp_path_factory)


def prompt(images: int, pad: int = 0) -> np.ndarray:
    """Text, then per image <|vision_start|>, its tokens, <|vision_end|>."""
    rng = np.random.default_rng(images)
    ids = [0] * pad + [1]
    for t, h, w in GRIDS[:images]:
        ids += list(rng.integers(3, IMAGE, 3)) + [START] + [IMAGE] * (t * h * w // 4) + [END]
    return np.asarray([ids + list(rng.integers(3, IMAGE, 4))], np.int64)


def pixels(images: int) -> np.ndarray:
    rows = int(GRIDS[:images].prod(1).sum())
    return np.random.default_rng(10 + images).standard_normal((rows, 3 * 2 * 4 * 4)).astype(np.float32)


def reference(model, ids, pixel_values, grids, mask=None):
    kwargs = {} if mask is None else {"attention_mask": torch.from_numpy(mask)}
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixel_values),
                    image_grid_thw=torch.from_numpy(grids), mm_token_type_ids=torch.from_numpy((ids == IMAGE) * 1),
                    **kwargs)
        vision = model.model.visual(torch.from_numpy(pixel_values), grid_thw=torch.from_numpy(grids))
        # Qwen3-VL's DeepStack levels beside the features: irc's image_features [I, (1 + levels)·d]
        features = torch.cat([vision.pooler_output, *(getattr(vision, "deepstack_features", None) or [])], dim=-1)
    return features.numpy(), out.logits.numpy()


def decoder_feeds(graph, ids, features, grids, mask=None) -> dict:
    """The prompt's feeds: its 3-D positions, empty caches (and zero recurrent states)."""
    from backends.onnx.runtime import empty_caches

    mask = np.ones_like(ids) if mask is None else mask
    positions, _ = mrope_positions(ids, grids, IMAGE, 2, mask)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "image_features": features,
            **empty_caches(graph, ids.shape[0])}


@pytest.mark.parametrize("name", sorted(CLASSES))
@pytest.mark.parametrize("images", [1, 2])
def test_interpreter_matches_transformers(twins, name, images):
    model, folder = twins(name)
    graph = load_spec(folder)
    vision = graph.parts["vision"]
    assert [(v.name, v.shape) for v in vision.inputs] == [("pixel_values", ("4*I", 96)), ("image_grid_thw", ("N", 3))]
    assert ("pos_embed" in vision.params) == name.startswith("qwen3")
    assert vision.outputs[0].shape == ("I", 48 * {"qwen3_vl": 3, "qwen3_vl_moe": 2}.get(name, 1))
    assert [v.shape for v in graph.inputs if v.name == "position_ids"] == [(3, "B", "T")]
    ids, pixel_values, grids = prompt(images), pixels(images), GRIDS[:images]
    want_features, want_logits = reference(model, ids, pixel_values, grids)
    features = run(vision, {"pixel_values": pixel_values, "image_grid_thw": grids})["image_features"]
    assert relative_error(features, want_features) <= TOLERANCE
    logits = run(graph, decoder_feeds(graph, ids, features, grids))["logits"]
    assert relative_error(logits, want_logits) <= TOLERANCE
    # the positions are transformers' get_rope_index's, rope deltas included
    want_positions, want_delta = model.model.get_rope_index(
        torch.from_numpy(ids), mm_token_type_ids=torch.from_numpy((ids == IMAGE) * 1),
        image_grid_thw=torch.from_numpy(grids))
    positions, delta = mrope_positions(ids, grids, IMAGE, 2)
    np.testing.assert_array_equal(positions, want_positions.numpy())
    np.testing.assert_array_equal(delta, want_delta.numpy()[:, 0])


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_a_left_padded_batch_matches_transformers(twins, name):
    """Row 0 holds an image; row 1 is text, padded on the left: the mask and the positions
    (and, in Qwen3.5's DeltaNet layers, the padding kept out of the recurrent state)."""
    model, folder = twins(name)
    graph = load_spec(folder)
    image = prompt(1)
    text = np.random.default_rng(5).integers(3, IMAGE, (1, image.shape[1] - 5))
    ids = np.concatenate([image, np.concatenate([np.zeros((1, 5), np.int64), text], axis=1)])
    mask = np.ones_like(ids)
    mask[1, :5] = 0
    _, want = reference(model, ids, pixels(1), GRIDS[:1], mask)
    features = run(graph.parts["vision"], {"pixel_values": pixels(1), "image_grid_thw": GRIDS[:1]})["image_features"]
    logits = run(graph, decoder_feeds(graph, ids, features, GRIDS[:1], mask))["logits"]
    assert relative_error(logits[:, -1], want[:, -1]) <= TOLERANCE


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_onnx_folder_matches_transformers(twins, tmp_path, name, target):
    from irc_cli.run_vlm import FolderModel

    model, folder = twins(name)
    out = tmp_path / "out"
    assert main(["compile", folder, "--target", target, "-o", str(out / "model.onnx"), "--quiet"]) == 0
    vlm = FolderModel(str(out))
    assert [v.name for v in vlm.vision.get_inputs()] == ["pixel_values", "image_grid_thw"]
    assert vlm.position_axes == 3
    ids, pixel_values = prompt(2), pixels(2)
    want_features, want_logits = reference(model, ids, pixel_values, GRIDS)
    vision = vlm.vision.run(None, {"pixel_values": pixel_values, "image_grid_thw": GRIDS})[0]
    assert relative_error(vision, want_features) <= TOLERANCE
    feeds = {k: v for k, v in decoder_feeds(load_spec(folder), ids, vision, GRIDS).items() if k != "image_features"}
    logits = vlm.step(feeds, vision)["logits"]
    assert relative_error(logits[:, -1], want_logits[:, -1]) <= TOLERANCE


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_onnx_folder_generates_transformers_tokens(twins, tmp_path, name):
    """irc's loop over the three models (the prompt's 3-D positions, then each step's plain
    position plus the prompt's delta) gives transformers' 16 greedy tokens."""
    from irc_cli.run_vlm import FolderModel, runner

    model, folder = twins(name)
    out = tmp_path / "out"
    assert main(["compile", folder, "--target", "onnx-ort", "-o", str(out / "model.onnx"), "--quiet"]) == 0
    ids, pixel_values = prompt(1), pixels(1)
    with torch.no_grad():
        want = model.generate(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixel_values),
                              image_grid_thw=torch.from_numpy(GRIDS[:1]),
                              mm_token_type_ids=torch.from_numpy((ids == IMAGE) * 1),
                              attention_mask=torch.ones_like(torch.from_numpy(ids)), max_new_tokens=16,
                              min_new_tokens=16, do_sample=False)[0, ids.shape[1]:].tolist()
    got = runner(FolderModel(str(out)), pixel_values, tuple(GRIDS[0]))(str(out), ids[0].tolist(), 16, set(), Clock(),
                                                                       engine="ort")
    assert got.tokens == want


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5"])
def test_irc_run_makes_the_processors_patches(twins, tmp_path, capsys, name):
    """``irc run --image`` on the HF folder (interpreter) and its ONNX folder (irc's loop, and
    onnxruntime-genai 0.18 from the folder's genai_config.json: its own 3-D positions; for
    Qwen3-VL, DeepStack's levels carried in widened embeddings; for Qwen3.5, its DeltaNet
    layers' conv and recurrent states beside the KV caches): the image
    through Qwen2VLImageProcessor's steps, <|image_pad|> widened to its tokens, the same answer
    as transformers given the processor's own pixel values."""
    from PIL import Image

    model, folder = twins(name)
    image = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(3).random((37, 53, 3)) * 255).astype(np.uint8)).save(image)
    processed = transformers.Qwen2VLImageProcessorPil(**{k: v for k, v in PROCESSOR.items()
                                                         if k != "image_processor_type"})(Image.open(image))
    grid = processed["image_grid_thw"].numpy() if hasattr(processed["image_grid_thw"], "numpy") else np.asarray(
        processed["image_grid_thw"])
    tokens = int(grid.prod() // 4)
    ids = np.asarray([[1, 7, START] + [IMAGE] * tokens + [END, 9]], np.int64)
    with torch.no_grad():
        want = model.generate(input_ids=torch.from_numpy(ids),
                              pixel_values=torch.as_tensor(np.asarray(processed["pixel_values"])),
                              image_grid_thw=torch.as_tensor(grid), mm_token_type_ids=torch.from_numpy((ids == IMAGE) * 1),
                              max_new_tokens=6, min_new_tokens=6, do_sample=False)[0, ids.shape[1]:].tolist()
    out = tmp_path / "out"
    assert main(["compile", folder, "--target", "onnx", "-o", str(out / "model.onnx"), "--quiet"]) == 0
    (out / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == GENAI_TYPES[name]
    engines = {(folder, "auto"): "reference interpreter", (str(out), "ort"): "onnxruntime (vision, embedding, decoder)",
               (str(out), "genai"): "onnxruntime-genai"}
    for (source, engine), name in engines.items():
        if engine == "genai":
            pytest.importorskip("onnxruntime_genai")
        assert main(["run", source, "--image", str(image), "--prompt-ids", f"1,7,{START},{IMAGE},{END},9",
                     "--engine", engine, "--max-new-tokens", "6", "--json", "--quiet"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["prompt_tokens"] == ids[0].tolist() and report["engine"] == name
        assert report["tokens"] == want, source


def test_qwen3_vl_moe_reads_the_hubs_expert_layout(twins, tmp_path):
    """The hub's Qwen3-VL-MoE checkpoints hold the experts as [E, d, 2F] and [E, F, d] (what
    transformers' converter transposes on load); transformers 5 saves [E, 2F, d] and [E, d, F].
    Both read as the same model."""
    from safetensors.numpy import load_file, save_file

    _, folder = twins("qwen3_vl_moe")
    tensors = load_file(f"{folder}/model.safetensors")
    for key in [k for k in tensors if ".mlp.experts." in k]:
        tensors[key] = np.ascontiguousarray(tensors[key].transpose(0, 2, 1))
    hub = tmp_path / os.path.basename(folder)
    hub.mkdir()
    save_file(tensors, str(hub / "model.safetensors"))
    (hub / "config.json").write_text(open(f"{folder}/config.json").read())
    ids, pixel_values = prompt(1), pixels(1)
    logits = []
    for source in (folder, str(hub)):
        graph = load_spec(source)
        features = run(graph.parts["vision"], {"pixel_values": pixel_values, "image_grid_thw": GRIDS[:1]})
        logits.append(run(graph, decoder_feeds(graph, ids, features["image_features"], GRIDS[:1]))["logits"])
    np.testing.assert_array_equal(logits[0], logits[1])


def _config(tmp_path, twins, **changes) -> str:
    return changed_config(twins("qwen2_5_vl")[1], tmp_path / "bad", changes)


@pytest.mark.parametrize("changes, key", [
    ({"vision_config.out_hidden_size": 40}, "vision_config.out_hidden_size"),
    ({"vision_config.hidden_act": "gelu"}, "vision_config.hidden_act"),
    ({"vision_config.window_size": 10}, "vision_config.window_size"),
    ({"vision_config.fullatt_block_indexes": [5]}, "vision_config.fullatt_block_indexes"),
    ({"text_config.rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 2, 3]}},
     "text_config.rope_parameters"),
])
def test_config_mistakes_name_the_key(twins, tmp_path, capsys, changes, key):
    folder = _config(tmp_path, twins, **changes)
    assert main(["show", folder]) == 2
    assert key in capsys.readouterr().err


@pytest.mark.parametrize("name, vision, key", [
    ("qwen3_vl", {"deepstack_visual_indexes": [1, 3]}, "vision_config.deepstack_visual_indexes"),  # 3 layers
    ("qwen3_vl", {"num_position_embeddings": 15}, "vision_config.num_position_embeddings"),  # not a square grid
    ("qwen3_5", {"hidden_act": "silu"}, "vision_config.hidden_act"),
])
def test_qwen3_config_mistakes_name_the_key(twins, tmp_path, capsys, name, vision, key):
    bad = changed_config(twins(name)[1], tmp_path, {f"vision_config.{k}": v for k, v in vision.items()})
    assert main(["show", bad]) == 2
    assert key in capsys.readouterr().err


def test_the_hubs_flat_layout_reads_the_same_model(twins, tmp_path):
    """The hub's Qwen2.5-VL config.json keeps the text model's keys at the top, with
    ``rope_scaling: {type: mrope, mrope_section}``: the same graph."""
    _, folder = twins("qwen2_5_vl")
    data = json.loads(open(f"{folder}/config.json").read())
    text = data.pop("text_config")
    rope = text.pop("rope_parameters")
    text.pop("model_type")
    data.update(text, rope_theta=rope["rope_theta"], rope_scaling={"type": "mrope",
                                                                   "mrope_section": rope["mrope_section"]})
    flat = tmp_path / os.path.basename(folder)  # the graph is named after its folder
    flat.mkdir()
    (flat / "config.json").write_text(json.dumps(data))
    from irc.printer import print_graph
    assert print_graph(load_spec(str(flat))) == print_graph(load_spec(folder))


def test_the_full_size_example_counts_transformers_parameters():
    """Qwen2.5-VL-7B (examples/hf/qwen2.5-vl-7b, the hub's config.json) built by transformers on
    the meta device: irc's decoder and vision model hold its parameters."""
    from irc.analysis import analyze

    folder = f"{os.path.dirname(__file__)}/../../examples/hf/qwen2.5-vl-7b"
    config = transformers.AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    graph = load_spec(folder)
    vision = analyze(graph.parts["vision"])
    assert analyze(graph)["params_total"] + vision["params_total"] == sum(p.numel() for p in model.parameters())
    assert vision["params_total"] == sum(p.numel() for p in model.model.visual.parameters())
    assert vision["vision"]["tokens"] == 256  # a 448 x 448 image: 32 x 32 patches merged 2 x 2


def test_check_quantize_and_tile_take_the_tower(twins, tmp_path, capsys):
    """``--check`` feeds the tower a consistent grid (and reports int4's error on the image
    features); ``irc tile`` plans it at its reference image size beside the decoder."""
    _, folder = twins("qwen2_5_vl")
    assert main(["compile", folder, "--target", "onnx-ort", "--passes", "quantize", "--check", "-o",
                 str(tmp_path / "q" / "model.onnx")]) == 0
    err = capsys.readouterr().err
    assert "vision model: check passed" in err and "vision model: check reported: quantize moves the outputs" in err
    assert main(["tile", folder, "--target-npu", "examples/targets/edge-npu.yaml", "-o",
                 str(tmp_path / "plan.json")]) == 0
    plan = json.loads((tmp_path / "plan.vision.json").read_text())
    assert plan["options"]["vision"]["tokens"] == 3136 and plan["ops"]


@pytest.mark.parametrize("change, message", [
    ("extra", "checkpoint tensor visual.blocks.0.extra has no place in the vision tower"),
    ("missing", "the checkpoint has no tensor"),
    ("reshaped", "has shape"),
])
def test_a_checkpoint_that_does_not_fit_the_tower_names_the_tensor(twins, tmp_path, change, message):
    from safetensors.numpy import load_file, save_file

    from irc.errors import SpecError

    _, folder = twins("qwen2_5_vl")
    tensors = load_file(f"{folder}/model.safetensors")
    if change == "extra":
        tensors["visual.blocks.0.extra"] = np.zeros(3, np.float32)
    elif change == "missing":
        del tensors["visual.merger.mlp.0.bias"]
    else:
        tensors["visual.merger.mlp.2.bias"] = np.zeros(5, np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(open(f"{folder}/config.json").read())
    with pytest.raises(SpecError, match=message):
        load_spec(str(tmp_path))


def test_a_processor_that_contradicts_the_model_is_refused(twins, tmp_path, capsys):
    """preprocessor_config.json's patch_size against the tower's: one error naming the file and
    the key, exit 2."""
    from PIL import Image

    _, folder = twins("qwen2_5_vl")
    odd = tmp_path / "odd"
    odd.mkdir()
    for name in ("config.json", "model.safetensors"):
        (odd / name).symlink_to(os.path.join(folder, name))
    (odd / "preprocessor_config.json").write_text(json.dumps({**PROCESSOR, "patch_size": 14}))
    image = tmp_path / "photo.png"
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(image)
    assert main(["run", str(odd), "--image", str(image), "--prompt-ids", f"1,{START},{IMAGE},{END}"]) == 2
    err = capsys.readouterr().err
    assert "preprocessor_config.json" in err and "patch_size: 14 contradicts the model's 4" in err
