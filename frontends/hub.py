"""Hugging Face Hub ids as specs: ``owner/name`` -> the local folder of its snapshot.

A spec that is not an existing path and reads ``owner/name`` is a model repository on the
Hub; ``owner/name:FILE.gguf`` picks one GGUF file of it (a path inside the repository; for
a split set, its first part, and the other parts come with it). ``resolve`` fetches only
the files irc reads through ``huggingface_hub.snapshot_download``: config.json, the
safetensors checkpoint (the shards the index names, when it has one, and no other
``*.safetensors``), sentence-transformers' module configs, and the files a compiled
folder carries (``frontends.hf.TOKENIZER_FILES``: tokenizer, chat template,
generation_config.json, preprocessor_config.json); or the chosen GGUF file. The hub's
own cache and settings apply as huggingface_hub defines them: ``HF_HOME`` /
``HF_HUB_CACHE`` (where), ``HF_HUB_OFFLINE=1`` (the cache alone, no network), ``HF_TOKEN``
(gated and private repositories). ``revision`` is a branch, tag or commit.

huggingface_hub is imported here only, and only when an id is resolved: a YAML compile
never loads it. A snapshot folder is named by its commit, so ``named`` gives a graph loaded
from one the repository's name, as the same files in a folder ``name/`` would have.
"""
from __future__ import annotations

import json
import os
import re

from irc.errors import SpecError

ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+(:[^:]+\.gguf)?", re.IGNORECASE)
SPEC_SUFFIXES = (".yaml", ".yml", ".py", ".ir", ".gguf", ".json")  # a missing file, not an id
SMALL_FILES = ("config.json", "model.safetensors.index.json", "modules.json", "*/config.json",
               "config_sentence_transformers.json", "sentence_bert_config.json")
SPLIT = re.compile(r"(.*)-\d{5}-of-(\d{5})\.gguf", re.IGNORECASE)
CACHED = re.compile(r"models--(.+?)--([^/\\]+)[/\\]snapshots[/\\][^/\\]+[/\\]?$")


def is_id(spec) -> bool:
    """Whether ``spec`` names a Hub repository: not an existing path, ``owner/name``
    (``:FILE.gguf`` optional), and not a missing spec file (``dir/model.yaml``)."""
    spec = str(spec)
    if os.path.exists(spec) or not ID.fullmatch(spec):
        return False
    repo, _, gguf = spec.partition(":")
    return bool(gguf) or not repo.lower().endswith(SPEC_SUFFIXES)


def resolve(spec: str, revision=None) -> str:
    """The local path (a snapshot folder, or a GGUF file in one) of the Hub id ``spec`` at
    ``revision`` (the default branch when None), fetched into the hub's cache when online;
    one SpecError naming the id when it does not resolve or holds nothing irc reads."""
    repo, _, gguf = spec.partition(":")
    where = f"{repo}@{revision}" if revision else repo
    if gguf:
        folder = _snapshot(repo, revision, where, [gguf, _split_pattern(gguf)])
        path = os.path.join(folder, gguf)
        if not os.path.isfile(path):
            raise SpecError(f"the repository has no {gguf}", location=where, hint=_ggufs_hint(repo, revision))
        return path
    from frontends.hf import TOKENIZER_FILES

    folder = _snapshot(repo, revision, where, list(SMALL_FILES + TOKENIZER_FILES))
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise SpecError("the repository has no config.json: irc reads a model folder (config.json and "
                        "*.safetensors) or one GGUF file", location=where, hint=_ggufs_hint(repo, revision))
    return _snapshot(repo, revision, where, _weight_patterns(folder))


def named(graph, path: str):
    """``graph`` (loaded from ``path``) named after its repository when ``path`` is a
    snapshot folder of the hub's cache (``models--owner--name/snapshots/COMMIT``), its parts
    too (a VLM's ``COMMIT-vision`` becomes ``name-vision``); else as it was."""
    found = CACHED.search(os.path.abspath(path))
    if found:
        commit, name = os.path.basename(os.path.normpath(path)), found.group(2)
        for g in [graph, *getattr(graph, "parts", {}).values()]:
            if g.name.startswith(commit):
                g.name = name + g.name[len(commit):]
    return graph


def _weight_patterns(folder: str) -> list:
    """The safetensors files irc reads (``frontends.hf.weights.Checkpoint.find``): those the
    shard index names, else every one; sentence-transformers' Dense modules' in both cases."""
    try:
        with open(os.path.join(folder, "model.safetensors.index.json"), encoding="utf-8") as f:
            shards = sorted({str(v) for v in json.load(f)["weight_map"].values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ["*.safetensors"]  # no index (or one Checkpoint.find will refuse, naming it)
    return shards + ["*/*.safetensors"]


def _split_pattern(gguf: str) -> str:
    """A split GGUF set's other parts (``-00001-of-00003.gguf``), beside the chosen one."""
    split = SPLIT.fullmatch(gguf)
    return f"{split.group(1)}-*-of-{split.group(2)}.gguf" if split else gguf


def _snapshot(repo: str, revision, where: str, patterns: list) -> str:
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub import errors
    except ImportError:
        raise SpecError("a Hugging Face id needs huggingface_hub", location=where,
                        hint="pip install 'irc[hub]', or give a local folder or file") from None
    try:
        return snapshot_download(repo, revision=revision, allow_patterns=patterns)
    except errors.RevisionNotFoundError:
        raise SpecError(f"no revision {revision!r} in this repository", location=where) from None
    except (errors.RepositoryNotFoundError, errors.GatedRepoError) as err:
        raise SpecError(f"not a model repository this machine can read ({type(err).__name__}: "
                        "missing, private or gated)", location=where,
                        hint="a local path? it does not exist; a gated repository: HF_TOKEN or `hf auth login`") from None
    except errors.IncompleteSnapshotError:
        raise SpecError("its cached snapshot lacks files irc reads, and the Hub cannot be reached", location=where,
                        hint="online once to complete it (HF_HUB_OFFLINE unset)") from None
    except errors.LocalEntryNotFoundError:
        raise SpecError(_not_cached(repo, revision, constants), location=where,
                        hint=("unset HF_HUB_OFFLINE to fetch it" if constants.HF_HUB_OFFLINE else
                              "check the network (HF_ENDPOINT for a mirror)") + ", or give a local path") from None
    except (errors.HfHubHTTPError, OSError, ValueError) as err:
        raise SpecError(f"cannot fetch it: {' '.join(str(err).split())[:200]}", location=where) from None


def _not_cached(repo: str, revision, constants) -> str:
    """Why an id did not resolve without the network: no such repository in the cache, or
    not that revision of it."""
    mode = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hub cannot be reached"
    stored = os.path.join(constants.HF_HUB_CACHE, "models--" + repo.replace("/", "--"))
    if revision and os.path.isdir(stored):
        return f"revision {revision!r} is not in the local Hugging Face cache ({mode}; {constants.HF_HUB_CACHE})"
    return f"not a local path, and not in the local Hugging Face cache ({mode}; {constants.HF_HUB_CACHE})"


def _ggufs_hint(repo: str, revision):
    """The repository's GGUF files, as ``owner/name:FILE.gguf`` (online only), else None."""
    try:
        from huggingface_hub import constants, list_repo_files
        if constants.HF_HUB_OFFLINE:
            return None
        files = [f for f in list_repo_files(repo, revision=revision) if f.lower().endswith(".gguf")]
    except Exception:  # a hint only: the error it goes with says what is wrong
        return None
    firsts = [f for f in files if not SPLIT.fullmatch(f) or "-00001-of-" in f]
    return f"its GGUF files: {', '.join(f'{repo}:{f}' for f in firsts[:6])}" if firsts else None
