"""What ``irc run`` generates with: one greedy loop per kind of input, one table to pick.

Every runner has the signature

    runner(folder, prompt: list[int], max_new_tokens, eos: set[int], clock, engine="auto") -> Result

and calls ``clock.start()`` once the model is loaded, just before the prompt goes in, and
``clock.token(token)`` as each token arrives (the caller streams and times them); generation stops after an eos token or ``max_new_tokens``. ``Result.logits`` is the last
step's logits where the engine exposes them (the reference interpreter, onnxruntime).

- a spec (any frontend's input): ``interpreter``, irc's reference interpreter;
- a folder ``irc compile`` wrote: ``FOLDERS`` maps a marker file to its runner, first match
  wins: ``irc_npu.json`` (the onnx-npu target) to that target's host loop,
  ``backends.onnx_npu.host.generate``; ``genai_config.json`` to onnxruntime-genai when it is
  installed (``--engine genai``), else onnxruntime with irc's own greedy loop
  (``--engine ort``); ``irc_triton.json`` (the triton target) to its module, one process a
  rank (``irc_cli.run_triton``). A folder with one ``.onnx`` file and no marker runs in
  onnxruntime.
"""
from __future__ import annotations

import glob
import importlib
import importlib.util
import json
import os
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from irc import dims
from irc.errors import IRCError
from irc.inputs import read_json
from irc.output import import_native
from irc.ops.rope import CACHE_REFRESH_KEY, cache_refresh_length
from irc_cli.speculative_mtp import MTP_FILE, MtpDrafter

GENAI_CONFIG = "genai_config.json"
NPU_CONFIG = "irc_npu.json"
VLM_MANIFEST = "irc_vlm.json"  # backends.onnx.vlm
TRITON_MANIFEST = "irc_triton.json"  # backends.triton.emit


@dataclass
class Result:
    tokens: list
    engine: str
    logits: Optional[np.ndarray] = None


def greedy_loop(step, caches: dict, prompt: list, max_new_tokens: int, eos: set, clock,
                refresh: Optional[int] = None, positions=None, speculative: Optional[tuple] = None) -> tuple:
    """Greedy decoding with the KV cache and recurrent states through ``step(feeds) ->
    outputs`` (``caches``: the empty ``past_key_values.*`` caches and zero states; each
    state fed back is checked against its shape): (tokens, last logits). ``refresh``
    (LongRoPE: ``irc.ops.rope.cache_refresh_length``): the step reaching that length runs
    the whole sequence again from the empty caches, as transformers' generate does.
    ``positions(past, ids)`` gives a step's ``position_ids`` where they are not past..past+T-1
    (Qwen-VL's multimodal ones: ``irc_cli.run_vlm``). ``speculative`` (drafter, k): drafts
    checked a call at a time, the same tokens (``irc_cli.speculative``); the report is stored
    as ``clock.speculation``."""
    if speculative is not None:
        if refresh is not None:
            raise IRCError("--speculative: this model (LongRoPE) runs the whole sequence again where it crosses "
                           "original_max_position_embeddings", hint="run it without --speculative")
        from irc_cli.speculative import speculative_loop

        tokens, last, clock.speculation = speculative_loop(step, caches, prompt, max_new_tokens, eos, clock,
                                                           *speculative, positions=positions)
        return tokens, last
    ids = np.asarray([prompt], dtype=np.int64)
    past, tokens, last = 0, [], None
    states = {name for name, array in caches.items() if array.size}  # fixed size: checked as fed back
    empty = dict(caches)
    clock.start()
    while len(tokens) < max_new_tokens:
        if refresh is not None and past == refresh - 1 and ids.shape[1] == 1:
            ids, past, caches = np.asarray([list(prompt) + tokens], dtype=np.int64), 0, dict(empty)
        t = ids.shape[1]
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, past + t), np.int64),
                 "position_ids": np.arange(past, past + t, dtype=np.int64)[None, :] if positions is None
                 else positions(past, ids), **caches}
        outputs = step(feeds)
        last = outputs["logits"][0, -1]
        token = int(np.argmax(last))
        tokens.append(token)
        clock.token(token)
        if token in eos:
            break
        caches = {name: _fed_back(name, outputs, caches[name], name in states) for name in caches}
        past += t
        ids = np.asarray([[token]], dtype=np.int64)
    return tokens, last


def _fed_back(name: str, outputs: dict, past: np.ndarray, state: bool) -> np.ndarray:
    """The step's ``present.*`` for the input ``name``; a recurrent ``state`` (an input of
    fixed size, no empty past axis) must come back in the shape it went in."""
    present = outputs["present." + name[len("past_key_values."):]]
    if state and present.shape != past.shape:
        raise IRCError(f"state input {name} takes {list(past.shape)}, but the model returned "
                       f"{list(present.shape)} as present.{name[len('past_key_values.'):]}",
                       hint="the model's present state does not fit its past: recompile the folder")
    return present


def interpreter(graph, prompt, max_new_tokens, eos, clock, seed: int = 0, speculative=None) -> Result:
    """A graph in the reference interpreter (absent weights seeded by name, ``seed``)."""
    from backends.onnx.runtime import empty_caches, interpreter_engine

    caches = empty_caches(graph, 1)
    speculative = with_drafter(speculative, lambda: graph_drafter(graph, seed))  # mtp: the graph's head
    tokens, last = greedy_loop(interpreter_engine(graph, seed), caches, prompt, max_new_tokens, eos, clock,
                               cache_refresh_length(graph), speculative=speculative)
    return Result(tokens, "reference interpreter", last)


ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8,
             "tensor(uint8)": np.uint8, "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def onnxruntime(folder, prompt, max_new_tokens, eos, clock, speculative=None) -> Result:
    """The folder's model in an onnxruntime CPU session, irc's greedy loop around it."""
    from backends.onnx.runtime import ort_session

    session = ort_session(model_path(folder), threads=None)
    names = [o.name for o in session.get_outputs()]
    if "logits" not in names:  # an embedding model (last_hidden_state, sentence_embedding)
        raise IRCError(f"the model has no logits output (its outputs: {', '.join(names)}): nothing to generate with",
                       location=folder, hint="an encoder's folder is for embedding, not irc run")
    caches = session_caches(session, folder)
    refresh = session.get_modelmeta().custom_metadata_map.get(CACHE_REFRESH_KEY)
    speculative = with_drafter(speculative, lambda: folder_drafter(folder))  # mtp: the folder's mtp.onnx
    coarse = speculative is not None and batch_dependent(model_path(folder))
    tokens, last = greedy_loop(session_step(session), caches, prompt, max_new_tokens, eos, clock,
                               None if refresh is None else int(refresh), speculative=speculative)
    if coarse and clock.speculation is not None:
        clock.speculation["note"] = COARSE
    return Result(tokens, "onnxruntime", last)


COARSE = ("this folder's MatMulNBits run with int8 activations (accuracy level 4), whose kernels round a call "
          "over several tokens differently from a one-token step: the checked draft can choose otherwise where "
          "two logits are close, so the answer may part from plain greedy's; a folder with exact products "
          "(--gguf-weights exact, or quantize{accuracy_level=0}) gives plain greedy's tokens")


def batch_dependent(path: str) -> bool:
    """Whether the model has MatMulNBits nodes of a nonzero accuracy level (int8 activations)."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    return any(node.op_type == "MatMulNBits" and any(a.name == "accuracy_level" and a.i != 0 for a in node.attribute)
               for node in graph.node)


def draft_model(path: str, seed: int = 0):
    """``--speculative draft=PATH``'s drafter (``irc_cli.speculative.DraftModel``): a compiled
    folder in onnxruntime, or a spec in the reference interpreter."""
    from irc_cli.speculative import DraftModel

    compiled = compiled_folder(path)
    if compiled is not None:
        folder, runner = compiled
        if runner is npu_host:
            raise IRCError("--speculative draft=: an onnx-npu folder runs in its host loop, not as a drafter",
                           location=folder, hint="draft with an onnx or onnx-ort folder")
        from backends.onnx.runtime import ort_session

        session = ort_session(model_path(folder), threads=None)
        return DraftModel(session_step(session), session_caches(session, folder))
    from backends.onnx.runtime import empty_caches, interpreter_engine
    from irc_cli.spec import load

    graph = load(path)
    return DraftModel(interpreter_engine(graph, seed), empty_caches(graph, 1))


def folder_drafter(folder: str) -> MtpDrafter:
    """``--speculative mtp``'s drafter (``irc_cli.speculative_mtp``) of a folder compiled with
    ``--mtp``: its ``mtp.onnx`` in onnxruntime."""
    from backends.onnx.runtime import ort_session

    path = os.path.join(folder, MTP_FILE)
    if not os.path.isfile(path):
        raise IRCError(f"--speculative mtp: this folder has no {MTP_FILE} (a multi-token-prediction head)",
                       location=folder, hint="compile a checkpoint that holds one with --mtp, or draft with "
                                             "--speculative ngram")
    session = ort_session(path, threads=None)
    return MtpDrafter(session_step(session), session_caches(session, folder))


def session_step(session) -> Callable:
    """``step(feeds) -> outputs`` by name through ``session`` (feeds it has no input for left out)."""
    names, inputs = [o.name for o in session.get_outputs()], {v.name for v in session.get_inputs()}

    def step(feeds):
        return dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in inputs})))
    return step


def with_drafter(speculative, make: Callable):
    """``speculative`` (drafter, k, model) with the MTP drafter ``make()`` where it names mtp."""
    if speculative is None or speculative[0] != "mtp":
        return speculative
    return speculative[0], speculative[1], make()


def graph_drafter(graph, seed: int = 0) -> MtpDrafter:
    """The drafter of a spec's graph, its head in the reference interpreter."""
    from backends.onnx.runtime import empty_caches, interpreter_engine

    head = graph.parts.get("mtp")
    return MtpDrafter(interpreter_engine(head, seed), empty_caches(head, 1))


def input_type(session, name: str):
    """The NumPy type of the session's input ``name`` (an fp16 model takes f16 pixels)."""
    value = next(v for v in session.get_inputs() if v.name == name)
    return ORT_TYPES.get(value.type, np.float32)


def session_caches(session, folder: str) -> dict:
    """A session's ``past_key_values.*`` inputs, empty (batch 1, no past), in their own types."""
    caches = {}
    for value in session.get_inputs():
        if value.name.startswith("past_key_values."):
            if value.type not in ORT_TYPES:
                raise IRCError(f"input {value.name} is {value.type}, which irc's onnxruntime loop cannot feed",
                               location=folder, hint="install onnxruntime-genai and use --engine genai")
            shape = [1 if i == 0 else 0 if isinstance(d, str) or d is None else d for i, d in enumerate(value.shape)]
            caches[value.name] = np.zeros(shape, ORT_TYPES[value.type])
    return caches


def genai(folder, prompt, max_new_tokens, eos, clock, inputs: Optional[dict] = None) -> Result:
    """The folder in onnxruntime-genai, greedy (its config's eos ends the answer). ``inputs``:
    named arrays handed in beside the prompt's ids, as genai's multimodal processor hands
    them (a VLM's ``pixel_values`` and ``num_image_tokens``: ``irc_cli.run_vlm``)."""
    og = _genai_module()
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + max_new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    ids = np.asarray([prompt], np.int32)
    if inputs is not None:
        named = og.NamedTensors()
        for name, array in {"input_ids": ids, **inputs}.items():
            named[name] = np.ascontiguousarray(array)
    clock.start()
    if inputs is not None:
        generator.set_inputs(named)
    else:
        generator.append_tokens(ids)
    tokens = []
    while not generator.is_done() and len(tokens) < max_new_tokens:
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        tokens.append(token)
        clock.token(token)
        if token in eos:
            break
    return Result(tokens, "onnxruntime-genai")


def genai_mtp(folder, prompt, max_new_tokens, eos, clock, k: int) -> Result:
    """The folder in onnxruntime-genai's ``MtpGenerator``, greedy, its ``mtp.onnx`` drafting up
    to ``k`` tokens a round (``backends.onnx.genai_mtp``); its statistics go to
    ``clock.speculation``."""
    from backends.onnx.genai_mtp import head_overlay

    _genai_mtp_check(folder)
    og = _genai_module()
    main = og.Model(folder)
    config = og.Config(folder)
    config.overlay(head_overlay(genai_config(folder)))
    params = og.GeneratorParams(main)
    params.set_search_options(max_length=len(prompt) + max_new_tokens, do_sample=False)
    params.set_speculative_options(max_draft_tokens=k)
    generator = og.MtpGenerator(main, og.Model(config), params)
    clock.start()
    generator.append_tokens(np.asarray(prompt, np.int32))
    tokens = []
    while not generator.is_done() and len(tokens) < max_new_tokens and not (tokens and tokens[-1] in eos):
        generator.generate_next_token()
        for token in generator.get_sequence()[len(prompt) + len(tokens):]:  # one a call (genai queues a round's)
            tokens.append(int(token))
            clock.token(int(token))
    stats = generator.get_stats()
    proposed, accepted = int(stats["draft_tokens_proposed"]), int(stats["draft_tokens_accepted"])
    clock.speculation = {"drafter": "mtp", "k": k, "proposed": proposed, "accepted": accepted,
                         "model_calls": int(stats["target_forward_passes"]),
                         "draft_calls": int(stats["draft_forward_passes"]), "rounds": int(stats["rounds"]),
                         "acceptance_rate": round(accepted / proposed, 4) if proposed else 0.0}
    return Result(tokens[:max_new_tokens], "onnxruntime-genai MtpGenerator")


def _genai_mtp_check(folder: str) -> None:
    """Refuse, with the reason, a folder genai 0.18's MTP generator cannot run."""
    from backends.onnx.genai_mtp import CPU_FLOAT32

    model = genai_config(folder).get("model", {})
    if not os.path.isfile(os.path.join(folder, MTP_FILE)):
        raise IRCError(f"--speculative mtp: this folder has no {MTP_FILE} (a multi-token-prediction head)",
                       location=folder, hint="compile a checkpoint that holds one with --mtp")
    if "mtp" not in model:
        raise IRCError(f"--engine genai --speculative mtp: {GENAI_CONFIG} has no model.mtp section",
                       location=folder, hint="compile the folder again with this irc (or use --engine ort)")
    if not model["decoder"].get("session_options", {}).get("provider_options") and _logits_type(folder) == 1:
        raise IRCError(f"--engine genai --speculative mtp: {CPU_FLOAT32}", location=folder,
                       hint="compile with --dtype f16, or use --engine ort (irc's loop drafts with the head)")


def _logits_type(folder: str) -> Optional[int]:
    """The ONNX element type of the folder model's ``logits`` output (1: float32)."""
    import onnx

    graph = onnx.load(model_path(folder), load_external_data=False).graph
    return next((o.type.tensor_type.elem_type for o in graph.output if o.name == "logits"), None)


def _genai_module():
    try:
        onnxruntime_genai = import_native("onnxruntime_genai")  # Ctrl-C deferred past its native init
    except ImportError:
        raise IRCError("--engine genai needs the onnxruntime-genai package",
                       hint="pip install onnxruntime-genai, or use --engine ort (plain onnxruntime)") from None
    return onnxruntime_genai


def npu_host(folder, prompt, max_new_tokens, eos, clock, engine: str = "auto", speculative=None) -> Result:
    """The onnx-npu target's folder through its host loop (its prefill time includes loading)."""
    if speculative is not None:
        raise IRCError("--speculative: the onnx-npu host loop runs fixed chunk and decode graphs, one token a "
                       "decode call", location=folder, hint="run an onnx or onnx-ort folder with --speculative")
    try:
        host = importlib.import_module("backends.onnx_npu.host")
    except ImportError as err:
        raise IRCError(f"{NPU_CONFIG}: this folder is for the onnx-npu target, whose host loop "
                       f"(backends.onnx_npu.host) cannot be imported: {err}", location=folder) from None
    clock.start()
    tokens = host.generate(folder, prompt, max_new_tokens, sorted(eos), on_token=clock.token)
    return Result(list(tokens), "onnx-npu host loop")


def onnx_folder(folder, prompt, max_new_tokens, eos, clock, engine: str = "auto", speculative=None) -> Result:
    """``genai`` when installed (and asked for or ``auto``), else ``onnxruntime``; with
    ``speculative``, onnxruntime (irc's loop checks the drafts), or with ``--engine genai``
    and the mtp drafter, genai's own MTP generator (``genai_mtp``)."""
    if engine == "genai" and speculative is not None:
        if speculative[0] == "mtp":
            return genai_mtp(folder, prompt, max_new_tokens, eos, clock, speculative[1])
        raise IRCError(f"--speculative {speculative[0]} runs in irc's own loop over onnxruntime, not in "
                       "onnxruntime-genai (which drafts with --speculative mtp)", hint="use --engine ort (or auto)")
    if speculative is None and (engine == "genai" or (engine == "auto" and _has_genai() and
                                                      os.path.isfile(os.path.join(folder, GENAI_CONFIG)))):
        return genai(folder, prompt, max_new_tokens, eos, clock)
    return onnxruntime(folder, prompt, max_new_tokens, eos, clock, speculative=speculative)


def _has_genai() -> bool:
    return importlib.util.find_spec("onnxruntime_genai") is not None


def triton_folder(folder, prompt, max_new_tokens, eos, clock, engine: str = "auto", speculative=None) -> Result:
    """The triton target's module, one process a rank (``irc_cli.run_triton``)."""
    from irc_cli.run_triton import run
    return Result(*run(folder, prompt, max_new_tokens, eos, clock, engine, speculative))


# marker file in the folder -> its runner; the first that is present wins
FOLDERS: tuple[tuple[str, Callable], ...] = (
    (NPU_CONFIG, npu_host),
    (VLM_MANIFEST, onnx_folder),  # a VLM's three models: irc_cli.run_vlm takes over the runner
    (GENAI_CONFIG, onnx_folder),
    (TRITON_MANIFEST, triton_folder),
)


def compiled_folder(path: str) -> Optional[tuple[str, Callable]]:
    """(folder, runner) when ``path`` is a folder ``irc compile`` wrote (or a model file in
    one), else None."""
    folder = os.path.dirname(os.path.abspath(path)) if path.endswith(".onnx") and os.path.isfile(path) else path
    if not os.path.isdir(folder):
        return None
    for marker, runner in FOLDERS:
        if os.path.isfile(os.path.join(folder, marker)):
            return folder, runner
    if glob.glob(os.path.join(folder, "*.onnx")) and not os.path.isfile(os.path.join(folder, "config.json")):
        return folder, onnx_folder
    return None


def genai_config(folder: str) -> dict:
    path = os.path.join(folder, GENAI_CONFIG)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as err:
        raise IRCError(f"not valid JSON: {err}", location=path) from None


def model_path(folder: str) -> str:
    """The model file: genai_config.json's ``decoder.filename``, a dual encoder's image tower
    (``irc_dual.json``), else the folder's one .onnx file (an MTP head's ``mtp.onnx`` beside it aside)."""
    name = genai_config(folder).get("model", {}).get("decoder", {}).get("filename")
    if name:
        return os.path.join(folder, name)
    dual = os.path.join(folder, "irc_dual.json")
    if os.path.isfile(dual):
        return os.path.join(folder, read_json(dual)["image"])
    found = sorted(p for p in glob.glob(os.path.join(folder, "*.onnx")) if os.path.basename(p) != MTP_FILE)
    if len(found) != 1:
        raise IRCError(f"expected one .onnx model in the folder, found {len(found)}", location=folder,
                       hint="run the model file itself: irc run FOLDER/model.onnx")
    return found[0]


def folder_model(folder: str) -> dict:
    """genai_config.json's model section, else a Triton folder's irc_triton.json (the same
    keys: eos_token_id, context_length, vocab_size)."""
    model = genai_config(folder).get("model", {})
    triton = os.path.join(folder, TRITON_MANIFEST)
    return model if model or not os.path.isfile(triton) else read_json(triton)


def folder_limits(folder: str) -> tuple[set, Optional[int]]:
    """(eos ids, context length) of a compiled folder: genai_config.json (irc_triton.json),
    else generation_config.json."""
    model = folder_model(folder)
    eos = model.get("eos_token_id")
    if eos is None:
        from frontends.hf.generation import generation_meta
        eos = generation_meta(folder, {}).get("eos_token_id")
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    return {int(i) for i in ids}, model.get("context_length")
