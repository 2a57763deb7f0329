"""Every twin of the twin tables (``tests/frontends/twins.py``: a row a tiny random twin,
its config class, settings and checks) against transformers: the reference interpreter's
logits on a left-padded batch of two and on each row run alone, its 16-token greedy
continuation, both ONNX targets in ONNX Runtime (prefill logits and the batch decoded
left-padded) and onnxruntime-genai on both targets' folders, each where the row asks for it;
twins with recurrent states against transformers running each row alone; twins whose
transformers ignores the mask on unpadded rows and an equal-length batch (``unmasked``).
A family is a table here (``family(...)``: its config class, settings and checks); its own
test module keeps what is the family's alone, on the same built twins. A new family is one
more table in ``TABLE``."""
import pytest

from tests.frontends.test_hf_deepseek_v32 import TWINS as DEEPSEEK_V32
from tests.frontends.test_hf_delta import TWINS as DELTA
from tests.frontends.test_hf_dsa import TWINS as DSA
from tests.frontends.test_hf_gemma3n import TWINS as GEMMA3N
from tests.frontends.test_hf_gemma4 import TWINS as GEMMA4
from tests.frontends.test_hf_gpt_oss import TWINS as GPT_OSS
from tests.frontends.test_hf_hybrid2 import TWINS as HYBRID2
from tests.frontends.test_hf_kolibri import TWINS as KOLIBRI
from tests.frontends.test_hf_longrope import TWINS as LONGROPE
from tests.frontends.test_hf_loops import TWINS as LOOPS
from tests.frontends.test_hf_phimoe import TWINS as PHIMOE
from tests.frontends.test_hf_qwen4 import TWINS as QWEN4
from tests.frontends.test_hf_recurrent_gemma import TWINS as RECURRENT_GEMMA
from tests.frontends.test_hf_rwkv import TWINS as RWKV
from tests.frontends.test_hf_xlstm import TWINS as XLSTM
from tests.frontends.twins import (ALONE, GENAI, GREEDY, GREEDY_ALONE, LOGITS, ONNX, ONNX_ALONE, PADDED_AS_HF, ROWS,
                                   STATES, STATES_ONNX, TARGETS, check_alone, check_genai, check_greedy,
                                   check_greedy_alone, check_logits, check_onnx, check_onnx_alone, check_padded_as_hf,
                                   check_rows, check_states, check_states_onnx, having, merged, models_fixture)

pytest.importorskip("torch")
pytest.importorskip("transformers")

TABLE = merged(DEEPSEEK_V32, DELTA, DSA, GEMMA3N, GEMMA4, GPT_OSS, HYBRID2, KOLIBRI, LOOPS, PHIMOE, QWEN4,
               RECURRENT_GEMMA, RWKV, XLSTM, phi3_longrope=LONGROPE)


models = models_fixture(TABLE)


@pytest.mark.parametrize("name", having(TABLE, ROWS))
def test_logits_match_the_padded_batch_and_each_row_alone(models, name):
    check_rows(models, name)


@pytest.mark.parametrize("name", having(TABLE, LOGITS))
def test_logits_match_on_a_left_padded_batch(models, name):
    check_logits(models, name)


@pytest.mark.parametrize("name", having(TABLE, GREEDY))
def test_greedy_generation_matches(models, name):
    check_greedy(models, name)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", having(TABLE, ONNX))
def test_onnx_runtime_matches_transformers(models, tmp_path, name, target):
    check_onnx(TABLE[name], models, name, tmp_path, target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", having(TABLE, GENAI))
def test_genai_generates_transformers_tokens(models, tmp_path, name, target):
    check_genai(TABLE[name], models, name, tmp_path, target)


@pytest.mark.parametrize("name", having(TABLE, STATES))
def test_interpreter_matches_transformers(models, name):
    check_states(models, name)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", having(TABLE, STATES_ONNX))
def test_onnx_and_genai_match_transformers(models, tmp_path, name, target):
    check_states_onnx(TABLE[name], models, name, tmp_path, target)


@pytest.mark.parametrize("name", having(TABLE, ALONE))
def test_logits_match_rows_and_an_equal_length_batch(models, name):
    check_alone(TABLE[name], models, name)


@pytest.mark.parametrize("name", having(TABLE, PADDED_AS_HF))
def test_left_padding_is_ignored_as_transformers_ignores_it(models, name):
    check_padded_as_hf(models, name)


@pytest.mark.parametrize("name", having(TABLE, GREEDY_ALONE))
def test_greedy_generation_matches_each_row_alone(models, name):
    check_greedy_alone(models, name)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", having(TABLE, ONNX_ALONE))
def test_onnx_runtime_matches_each_row_alone(models, tmp_path, name, target):
    check_onnx_alone(models, name, tmp_path, target)
