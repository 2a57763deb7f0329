"""The family index (frontends/hf/index.py) is the registry read back: every type
``describe`` dispatches appears once, under the module whose FAMILIES holds it, and every
module says in a sentence what it reads."""
from frontends.hf import families, index


def test_every_registered_type_has_one_module():
    listed = [t for types, _ in index.modules().values() for t in types]
    assert sorted(listed) == sorted(families.FAMILIES) and len(listed) == len(set(listed))
    where = index.module_of()
    assert where["llama"] == "families" and where["xglm"] == "families_xglm" and where["llama4"] == "families_llama4"


def test_every_module_says_what_it_reads():
    for name, (types, what) in index.modules().items():
        assert types and len(what) > 10 and "\n" not in what, name


def test_the_summary_is_the_first_sentence():
    assert index.summary("XGLM (registered), built by its loop.\n\nMore text.") == "XGLM (registered), built by its loop."
    assert index.summary("Recurrent-depth decoders:\n\n- HRM") == "Recurrent-depth decoders"
