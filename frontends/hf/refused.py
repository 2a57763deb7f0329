"""Model types of transformers' causal-LM mapping that irc refuses on purpose, and why: the
hint ``frontends.hf.families.describe`` gives for them (``benchmarks/breadth.py --census``
prints it). A type leaves this table when a family module registers it."""
from __future__ import annotations

_DRAFTER = ("a speculative-decoding drafter, not a causal LM of its own: it reads the target Gemma-4's "
            "hidden states and KV caches (inputs_embeds, shared_kv_states), never token ids alone; "
            "drafting with a checkpoint's own heads is irc's speculative-decoding work")
WHY = {
    "gemma4_assistant": _DRAFTER,
    "gemma4_unified_assistant": _DRAFTER,
    "blt": ("the Byte Latent Transformer patches bytes where its entropy model's next-byte entropy passes "
            "patching_threshold: the global transformer's sequence length depends on the data, and in decoding "
            "it grows only on the steps that open a patch; irc's decode step has one fixed form"),
    "cpmant": ("CPM-Ant prepends its prompt_length learned prompt tokens inside the model, on the call whose "
               "cache is empty only (modeling_cpmant.py CpmAntModel.forward: the prompt ids concatenated before "
               "input_ids, the first prompt_length outputs dropped when past_length == 0), attends "
               "bidirectionally across that whole first call (_prepare_attention_mask: context is all ones), and "
               "takes its padding mask from input_ids != 0, not attention_mask (a 'dummy parameter' of "
               "CpmAntForCausalLM.forward); irc's decoder is one graph for every call, its prefill causal and "
               "chunkable"),
}

__all__ = ["WHY"]
