"""Rewrite machinery shared by passes (and the backends' matchers): ``edit`` (constants,
casts, replacing a node's results under the naming rule) and ``patterns`` (rules: a pattern
written like the unfused math, a check that refuses with a reason, a rewrite)."""
