"""Op definitions. Importing this package registers every op."""
from irc.ops.registry import (OPS, REQUIRED, Cost, OpDef, TensorType, get_op, infer,  # noqa: F401
                              register)
# registration, in this order
from irc.ops import primitives, movement, nn, rope, attention, mla, mla_latent, moe, extra, moe_sorted, quant, ssm  # noqa: F401,E402
from irc.ops import delta, vision, rwkv, rglru  # noqa: F401,E402
from irc.ops import sparse_index  # noqa: F401,E402
from irc.ops import positions  # noqa: F401,E402
from irc.ops import activations  # noqa: F401,E402
from irc.ops import mlstm  # noqa: F401,E402
from irc.ops import ngram  # noqa: F401,E402
from irc.ops import nvfp4  # noqa: F401,E402
from irc.ops import collective  # noqa: F401,E402
