"""Op definitions. Importing this package registers every op."""
from irc.ops.registry import (OPS, REQUIRED, Cost, OpDef, TensorType, get_op, infer,  # noqa: F401
                              register)
from irc.ops import primitives, nn, rope, attention, mla, moe, extra, moe_sorted, quant  # noqa: F401,E402  (registration)
