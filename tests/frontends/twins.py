"""One harness for the tiny random twins held against transformers: a twin is a row (a
``Twin``: its transformers config class, its settings, its weight seed and what to check), a
family a table of rows (``family``); ``test_hf_twins.py`` runs every row's checks, the
family's own test module what is the family's alone, both on the same built twins.

The steps, each a function: build the twin with transformers and save it (``build``, once a
twin and session: ``built``), compile the folder with irc (``load_spec``), then the checks:
``ROWS`` the reference interpreter's logits on the left-padded batch and on each row alone
(``LOGITS``: on the batch alone), ``GREEDY`` its 16-token greedy continuation, ``ONNX`` both
ONNX targets in ONNX Runtime (``check_onnx``), ``GENAI`` both targets' folders in
onnxruntime-genai (``check_genai``).
Twins with recurrent states (whose padded rows transformers gets wrong: ``unpadded_logits``)
are held against transformers running each row alone: ``STATES`` the interpreter's logits
and greedy tokens, ``STATES_ONNX`` both ONNX targets and then genai on the same folder.
Twins whose transformers ignores the mask (``unmasked``) are held on unpadded rows and an
equal-length batch: ``ALONE`` the interpreter's logits, ``PADDED_AS_HF`` its logits on the
left-padded batch against transformers' own (the pads in the state), ``GREEDY_ALONE`` its
greedy tokens, ``ONNX_ALONE`` both ONNX targets.
``test_hf_models`` holds the comparisons themselves and their tolerance; config.json
mistakes, which need no twin, are ``refusals``'."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pytest

from frontends import load_spec
from irc.interpreter import generate
from tests.frontends.test_hf_models import (NEW_TOKENS, TOLERANCE, assert_greedy_matches, assert_logits_match,
                                            assert_ort_run_matches, assert_rows_match, hf_greedy_tokens, hf_logits,
                                            hf_padded_greedy, irc_logits, prompts, randomize, relative_error,
                                            save_twin)
from tests.frontends.test_hf_ssm import unpadded_logits
from tests.frontends.test_hf_ssm_onnx import assert_genai_generates, emit_genai_folder, genai_greedy, until_eos
from tests.frontends.unmasked import (assert_greedy_rows_match, assert_ort_rows_match, assert_padded_batch_matches,
                                      assert_rows_and_batch_match)

ROWS, LOGITS, GREEDY, ONNX, GENAI = "rows", "logits", "greedy", "onnx", "genai"
STATES, STATES_ONNX = "states", "states-onnx"
ALONE, PADDED_AS_HF, GREEDY_ALONE, ONNX_ALONE = "alone", "padded-as-hf", "greedy-alone", "onnx-alone"
CHECKS = (ROWS, GREEDY, ONNX)
TARGETS = ("onnx", "onnx-ort")


@dataclass(frozen=True)
class Twin:
    """One twin, ``name`` in its family: ``config`` (a transformers config class name) built
    with ``settings``, randomized with ``seed`` around ``norm_centre``, then ``tweak(model,
    name)`` where the features need larger weights to bite; ``make(config, settings)`` builds
    the model where it is not ``AutoModelForCausalLM`` (eager attention). ``checks``: which of the checks above
    the harness runs; ``context``: the ONNX emit's context (None: its default);
    ``genai_refused``: the ONNX check emits with genai on and expects it refused with this
    note; ``emits_alike``: a second emit of the folder must write the same bytes;
    ``genai_layers``: the layer count genai's config must hold; ``genai_until_eos``: genai's
    tokens are transformers' up to the folder's eos; ``batch_tokens(model)``: transformers'
    greedy tokens of the left-padded batch where generate's own answer other inputs;
    ``randomizer(model, seed)``: the family's own randomization in place of ``randomize``;
    ``hf_cache``: transformers runs the ``ALONE`` check with its cache."""
    config: str
    settings: dict
    seed: int
    name: str = ""
    checks: tuple = CHECKS
    norm_centre: float = 1.0
    context: Optional[int] = 64
    tweak: Optional[Callable] = None
    make: Optional[Callable] = None
    genai_refused: Optional[str] = None
    emits_alike: bool = False
    genai_layers: Optional[int] = None
    genai_until_eos: bool = False
    batch_tokens: Optional[Callable] = None
    randomizer: Optional[Callable] = None
    hf_cache: bool = True


def family(config: str, small: dict, cases: dict, rows: Optional[dict] = None, first_seed: int = 0,
           **common) -> dict:
    """A family's table: name -> ``Twin`` of ``config`` with ``small`` updated by the case's
    overrides (a case is its overrides, or ``(config class, overrides)``), each seeded by its
    place among the sorted names after ``first_seed`` (as the family files always seeded
    them). ``common``: the ``Twin`` fields every row shares; ``rows``: name -> the fields of
    that row alone."""
    rows = rows or {}
    table = {}
    for name, case in cases.items():
        kind, overrides = case if isinstance(case, tuple) else (config, case)
        table[name] = Twin(kind, {**small, **overrides}, first_seed + sorted(cases).index(name), name,
                           **{**common, **rows.get(name, {})})
    return table


def merged(*tables: dict, **labelled: dict) -> dict:
    """One table of several families' (their names must not collide); a table passed as
    ``label=table`` has its names prefixed ``label-`` (names that say little alone)."""
    out = {}
    tables += tuple({f"{label.replace('_', '-')}-{name}": twin for name, twin in table.items()}
                    for label, table in labelled.items())
    for table in tables:
        assert not set(out) & set(table), sorted(set(out) & set(table))
        out.update(table)
    return out


def having(table: dict, check: str) -> list:
    """The sorted names of the rows that ask for ``check``."""
    return sorted(name for name, twin in table.items() if check in twin.checks)


def causal_lm(config: str, settings: dict):
    import transformers

    model_config = getattr(transformers, config)(**settings)
    return transformers.AutoModelForCausalLM.from_config(model_config, attn_implementation="eager").eval()


def model_of(twin: Twin, **changes):
    """The twin's transformers model (its settings updated by ``changes``), randomized."""
    model = (twin.make or causal_lm)(twin.config, {**twin.settings, **changes})
    if twin.randomizer:
        twin.randomizer(model, twin.seed)
    else:
        randomize(model, seed=twin.seed, norm_centre=twin.norm_centre)
    if twin.tweak:
        twin.tweak(model, twin.name)
    return model


def build(twin: Twin, folder, **changes):
    """``model_of`` saved into ``folder``: (model, folder)."""
    return save_twin(model_of(twin, **changes), folder)


def twin_build(table: dict):
    """``build`` as ``built_once`` calls it: (name, folder) -> (model, folder)."""
    return lambda name, folder: build(table[name], folder)


_BUILT: dict = {}
_GREEDY: dict = {}


def built(table: dict, tmp_path_factory):
    """name -> (transformers model, saved folder), each twin built once a session whichever
    module (and table) asks first: pytest's copy of a family module and the one
    ``test_hf_twins`` imports hold equal twins."""
    def get(name):
        twin = table[name]
        key = (twin.name, twin.config, twin.seed, json.dumps(twin.settings, sort_keys=True, default=str))
        if key not in _BUILT:
            _BUILT[key] = build(twin, tmp_path_factory.mktemp(name))
        return _BUILT[key]

    return get


def models_fixture(table: dict):
    """The module's ``models`` fixture over ``table`` (``built``): ``models = models_fixture(TWINS)``."""
    @pytest.fixture(scope="module", name="models")
    def models(tmp_path_factory):
        return built(table, tmp_path_factory)

    return models


def batch_greedy(models, name: str):
    """transformers' greedy tokens [2, 16] for the left-padded batch; computed once a twin."""
    model = models(name)[0]
    if ("batch", id(model)) not in _GREEDY:
        _GREEDY["batch", id(model)] = model, hf_padded_greedy(model)
    return _GREEDY["batch", id(model)][1]


def row_greedy(models, name: str) -> np.ndarray:
    """transformers' greedy tokens [2, 16] of each prompt run alone, unpadded; once a twin."""
    model = models(name)[0]
    if ("alone", id(model)) not in _GREEDY:
        ids, mask, _ = prompts()
        tokens = [hf_greedy_tokens(model, ids[row][mask[row] == 1].tolist()) for row in range(len(ids))]
        _GREEDY["alone", id(model)] = model, np.array(tokens)
    return _GREEDY["alone", id(model)][1]


def check_rows(models, name: str) -> None:
    model, folder = models(name)
    assert_rows_match(load_spec(folder), model)


def check_logits(models, name: str) -> None:
    model, folder = models(name)
    assert_logits_match(load_spec(folder), model)


def check_greedy(models, name: str) -> None:
    model, folder = models(name)
    assert_greedy_matches(load_spec(folder), model, prompts()[0][0].tolist(), NEW_TOKENS)


def check_onnx(twin: Twin, models, name: str, tmp_path, target: str) -> None:
    """The twin emitted for ``target`` runs in ONNX Runtime to transformers' prefill logits
    and greedy tokens on the left-padded batch."""
    pytest.importorskip("onnxruntime")
    from backends.onnx import emit

    model, folder = models(name)
    graph = load_spec(folder)
    path = str(tmp_path / "model.onnx")
    context = {} if twin.context is None else {"context": twin.context}
    if twin.genai_refused:
        emitted = emit.emit_model(graph, path, target=target, **context)
        assert emitted.genai_config is None and twin.genai_refused in emitted.genai_note
    else:
        emit.emit_model(graph, path, target=target, genai=False, **context)
    want = twin.batch_tokens(model) if twin.batch_tokens else batch_greedy(models, name)
    assert_ort_run_matches(path, graph, hf_logits(model, *prompts()), want)
    if twin.emits_alike:
        again = tmp_path / "again.onnx"
        emit.emit_model(load_spec(folder), str(again), target=target, genai=False, **context)
        assert again.read_bytes() == (tmp_path / "model.onnx").read_bytes()


def check_genai(twin: Twin, models, name: str, tmp_path, target: str) -> None:
    """onnxruntime-genai 0.18 runs the ``target`` folder to transformers' greedy tokens of
    the first prompt (up to eos)."""
    _, folder = models(name)
    emit_genai_folder(load_spec(folder), tmp_path, target)
    if twin.genai_layers is not None:
        config = json.loads((tmp_path / "genai_config.json").read_text())
        assert config["model"]["decoder"]["num_hidden_layers"] == twin.genai_layers
    assert_genai_generates(tmp_path, batch_greedy(models, name)[0].tolist())


def check_numpy_and_triton(folder, tmp_path, name: str) -> None:
    """The twin's NumPy module equals the reference interpreter exactly, and its Triton prefill
    (Triton's interpreter) matches it (``test_hf_targets``)."""
    from tests.frontends.test_hf_targets import (test_numpy_module_matches_the_reference_exactly,
                                                 test_triton_prefill_matches_the_reference)

    test_numpy_module_matches_the_reference_exactly(lambda _: folder, tmp_path / "np", name)
    (tmp_path / "tt").mkdir()
    test_triton_prefill_matches_the_reference(lambda _: folder, tmp_path / "tt", name)


def check_states(models, name: str) -> None:
    """The reference interpreter's logits on the left-padded batch are transformers' on each
    row run alone; its greedy continuation of the long prompt is transformers'."""
    model, folder = models(name)
    graph = load_spec(folder)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    got, want = irc_logits(graph, ids, mask, positions), unpadded_logits(model, ids, mask)
    assert relative_error(got[real], want[real]) <= TOLERANCE
    tokens, _ = generate(graph, ids[0].tolist(), NEW_TOKENS)
    assert tokens == row_greedy(models, name)[0].tolist()


def check_states_onnx(twin: Twin, models, name: str, tmp_path, target: str) -> None:
    """Both rows through ONNX Runtime (irc's greedy loop, the states fed back) against each
    row run alone, then onnxruntime-genai on the same folder (or its refusal,
    ``genai_refused``)."""
    from backends.onnx import emit

    model, folder = models(name)
    graph = load_spec(folder)
    path = str(tmp_path / "model.onnx")
    emitted = emit.emit_model(graph, path, target=target, context=64)
    want = row_greedy(models, name)
    assert_ort_run_matches(path, graph, unpadded_logits(model, *prompts()[:2]), want)
    if twin.genai_refused:
        assert emitted.genai_config is None and twin.genai_refused in emitted.genai_note
        return
    og = pytest.importorskip("onnxruntime_genai")
    assert emitted.genai_config, emitted.genai_note
    tokens = until_eos(want[0].tolist(), tmp_path) if twin.genai_until_eos else want[0].tolist()
    assert genai_greedy(og, tmp_path, prompts()[0][0], NEW_TOKENS) == tokens



def check_alone(twin: Twin, models, name: str) -> None:
    assert_rows_and_batch_match(*models(name), use_cache=twin.hf_cache)


def check_padded_as_hf(models, name: str) -> None:
    assert_padded_batch_matches(*models(name))


def check_greedy_alone(models, name: str) -> None:
    assert_greedy_rows_match(*models(name))


def check_onnx_alone(models, name: str, tmp_path, target: str) -> None:
    assert_ort_rows_match(*models(name), tmp_path, target)
