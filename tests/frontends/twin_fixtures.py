"""Twin building the GGUF and VLM twin modules share: a tiny random transformers twin made as
``test_hf_models`` makes its own (``random_twin``: the config class with its settings,
``randomize``d with the case's seed, generation never stopping at an eos and padding with 0),
and the module fixture that builds each case once (``once_fixture``: name -> the module's
``make(name, a fresh folder)``: for a GGUF module the twin, its HF folder and the GGUF it
writes as llama.cpp's converter would). No transformers needed to import."""
import pytest


def random_twin(config: str, settings: dict, seed: int, norm_centre: float = 1.0, eager: bool = True):
    """transformers' ``config`` class with ``settings`` as ``AutoModelForCausalLM`` (eager
    attention unless not ``eager``), randomized around ``norm_centre`` with ``seed``; its
    generation config as ``save_twin`` leaves it."""
    import transformers

    from tests.frontends.test_hf_models import randomize

    model_config = getattr(transformers, config)(**settings)
    attention = {"attn_implementation": "eager"} if eager else {}
    model = transformers.AutoModelForCausalLM.from_config(model_config, **attention).eval()
    randomize(model, seed=seed, norm_centre=norm_centre)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def once_fixture(make, name: str = "models"):
    """The module fixture ``name``: case name -> ``make(name, a fresh folder)``, each built once."""
    @pytest.fixture(scope="module", name=name)
    def fixture(tmp_path_factory):
        from tests.frontends.test_hf_models import built_once

        return built_once(make, tmp_path_factory)

    return fixture
