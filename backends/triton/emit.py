"""The Triton emitter: one readable Python module of generated ``@triton.jit`` kernels and
the launcher that runs the graph with them.

``irc compile SPEC --target triton -o model_tt.py`` writes ``model_tt.py`` and its weights,
``model_tt.pt`` (a ``torch.save`` dict of tensors by param name, plus derived tables such
as RoPE inverse frequencies). The module needs torch and triton, not irc:

- ``forward(W, /, kv_storage=None, **inputs)`` takes the graph inputs by name (torch
  tensors or NumPy arrays), binds the symbolic dims from their shapes, runs one step per
  kernel launch in IR order (the IR lines each step implements are the comments above
  it) and returns the graph outputs by name as torch tensors;
- ``Session`` holds the weights and a preallocated KV cache on the device, so a decode
  step writes its new K/V rows in place instead of copying the past;
- ``KERNEL_SPECS`` and ``compile_kernels(capability)`` build every kernel for an NVIDIA
  GPU with none present (``triton.compile``), the proof the generated code is real.

It runs on a CUDA GPU, or on CPU through Triton's interpreter (``TRITON_INTERPRET=1`` set
before the module is imported). A sharded graph (``shard{tp=N}``) is one rank's program: its
weights are one file per rank, ``model_tt.rank{r}.pt``, and it runs in N processes under
``torch.distributed`` (``backends.triton.collective``). Beside the module, ``irc_triton.json``
names it, its world size and the model's eos, context and vocabulary for ``irc run``.
Which nodes run as generated kernels and which as torch ops is decided by
``backends.triton.plan`` and listed in the module's docstring.
"""
from __future__ import annotations

import importlib.util
import io
import json
import keyword
import os
import re

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.errors import BackendError
from irc.graph import Graph, Param
from irc.output import OutputFolder
from irc.printer import format_node
from irc.text import interface_lines
from irc.weights import seed_absent
from irc.world import Shard, world_size

from backends.triton import collective, fallback
from backends.triton.plan_ssm import NEW_TOKENS_HELPER
from backends.triton.kernels import NODES_MARKER, torch_type, wrap_code
from backends.triton.kernels.elementwise import TANH_HELPER
from backends.triton.kernels.matmul import CONFIGS_TEXT
from backends.triton.plan import Planner

INSTALL_HINT = "the triton target needs `pip install -e .[triton]`"
WRAP = 110

SETTINGS = '''# TRITON_INTERPRET=1 (Triton's own switch, read when kernels are defined): kernels run on CPU tensors
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")
DEVICE = torch.device("cpu" if INTERPRETED or not torch.cuda.is_available() else "cuda")
# fp32 tl.dot: "ieee" computes what the reference computes; "tf32" uses tensor cores (~1e-3 relative)
DOT_PRECISION = "ieee"
# True: matmul and attention tiles go to the tensor cores in 16 bits (bf16 models keep fp32
# activations; their dots then run at bf16 speed, ~1e-2 relative); False: exact
MIXED_DOT = False
# launch shapes (GPU, then the interpreter, which pays per program and per loop step)
ROW_TILE = 16384 if INTERPRETED else 4096        # elements of a row-kernel tile
ATTENTION_BLOCK_N = 16 if INTERPRETED else 64    # keys per attention loop step
ATTENTION_ROWS = 32 if INTERPRETED else 64       # query rows (heads x positions) per program
MLA_HEAD_BLOCK = 16 if INTERPRETED else 64       # MLA heads sharing one latent tile
DECODE_MIN_KEYS = 8 if INTERPRETED else 256      # keys per split-KV decode program, at least
DECODE_PROGRAMS = 4 if INTERPRETED else 264      # programs a decode step aims to fill the GPU with'''

TORCH_HELPERS = {
    "to_device": '''def to_device(value):
    """A torch tensor on DEVICE (NumPy arrays are refused by Triton; bf16 arrays go through fp32)."""
    if isinstance(value, np.ndarray):
        if value.dtype.name == "bfloat16":
            return torch.from_numpy(value.astype(np.float32)).to(DEVICE, torch.bfloat16)
        value = torch.from_numpy(np.ascontiguousarray(value))
    return value.to(DEVICE)''',
    "present_cache": '''def present_cache(past, new_tokens, storage, name):
    """The present cache [B, K, P + T, D] with the past in its first P positions: a view of
    ``storage[name]`` (a Session's preallocated cache, already holding the past) or a new
    buffer the past is copied into."""
    batch, heads, past_len, width = past.shape
    if storage is not None and name in storage:
        return storage[name][:, :, :past_len + new_tokens]
    present = torch.empty((batch, heads, past_len + new_tokens, width), device=past.device, dtype=past.dtype)
    present[:, :, :past_len].copy_(past)
    return present''',
    "rope_tables": '''def rope_tables(position_ids, inv_freq, factor):
    """cos and sin [B, T, R/2] (fp32) of position * inv_freq, times the attention factor."""
    angles = position_ids.to(torch.float32)[..., None] * inv_freq
    cos, sin = torch.cos(angles), torch.sin(angles)
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor
    return cos.contiguous(), sin.contiguous()''',
    "mrope_tables": '''def mrope_tables(position_ids, axis, inv_freq):
    """cos and sin [B, T, R/2] (fp32) of multi-axis positions [A, B, T]: pair j's angle is
    position[axis[j]] * inv_freq[j] (irc.ops.rope.mrope_angles)."""
    angles = position_ids.to(torch.float32)[axis].permute(1, 2, 0) * inv_freq
    return torch.cos(angles).contiguous(), torch.sin(angles).contiguous()''',
    "dynamic_inv_freq": '''def dynamic_inv_freq(dim, base, factor, original, position_ids):
    """Dynamic-NTK inverse frequencies for the longest position seen (HF's dynamic update)."""
    length = max(int(position_ids.max()) + 1, original) if position_ids.numel() else original
    base = base * ((factor * length / original) - (factor - 1)) ** (dim / (dim - 2))
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv_freq = (1.0 / (float(base) ** exponents.astype(np.float64))).astype(np.float32)
    return torch.from_numpy(inv_freq).to(DEVICE)''',
    "longrope_inv_freq": '''def longrope_inv_freq(short, long, original, position_ids):
    """LongRoPE's frequencies: the long set when max(position_ids) + 1 > original (HF's update)."""
    return torch.where(position_ids.max() + 1 > original, long, short)''',
    "ssm_new_tokens": NEW_TOKENS_HELPER,
}


def require_torch_triton() -> None:
    """A clear BackendError when the optional extra is missing."""
    missing = [name for name in ("torch", "triton") if importlib.util.find_spec(name) is None]
    if missing:
        raise BackendError(f"{' and '.join(missing)} not installed: {INSTALL_HINT}", hint=INSTALL_HINT)


def emit_module(graph: Graph, path: str, *, source: str = "") -> None:
    """Write the module to ``path`` and its weights to the .pt with the same stem.

    Both are built in memory first, then written atomically: an error leaves no file."""
    require_torch_triton()
    planner = Planner(graph).run()
    text = module_source(graph, planner, source=source)
    directory, name = os.path.split(os.path.abspath(path))
    stem, world = os.path.splitext(name)[0], world_size(graph) or 1
    files = collective.weight_files(stem, world) if world > 1 else [stem + ".pt"]
    weights = {file: weights_pt(graph, planner, rank if world > 1 else None) for rank, file in enumerate(files)}
    with OutputFolder(directory, primary=name) as out:  # every file or none
        for file, data in weights.items():
            out.write(file, data)
        out.write(MANIFEST, manifest(graph, name, world, files))
        out.write(name, text)


MANIFEST = "irc_triton.json"


def manifest(graph: Graph, name: str, world: int, files: list[str]) -> str:
    """What ``irc run`` reads from a Triton folder: the module, its world size and weight
    files, and the model's eos ids, context length and vocabulary size."""
    meta = graph.meta
    return json.dumps({"module": name, "world": world, "weights": files, "eos_token_id": meta.get("eos_token_id"),
                       "context_length": meta.get("max_positions"), "vocab_size": meta.get("vocab_size")},
                      indent=2) + "\n"


def load_module(path: str):
    """Import the emitted module at ``path`` (a fresh module object on every call)."""
    name = "irc_triton_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def weights_pt(graph: Graph, planner: Planner, rank=None) -> bytes:
    """The torch.save bytes of every weight the graph reads (absent ones seeded by name, as
    the reference interpreter does; a sharded graph's: rank ``rank``'s blocks) and the
    planner's derived tables."""
    import torch

    seed_absent(graph)
    centre = 1.0 - float(graph.meta.get("norm_offset", 0.0) or 0.0)
    tensors = {}
    for param in _weights(graph):
        if isinstance(param.data, Shard):
            array = param.data.for_rank(rank, centre=centre)
        else:
            array = np.asarray(param.array())
        if array.dtype != param.dtype.numpy or array.shape != param.shape:
            raise BackendError(f"param @{param.name} holds {array.dtype}{list(array.shape)} data but is declared "
                               f"{param.type_str()}", location=f"graph {graph.name}")
        if param.dtype == DType.bf16:
            tensors[param.name] = torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
        elif param.dtype in (DType.i4, DType.u4):
            raise BackendError(f"param @{param.name} is {param.dtype}: the triton target takes packed u8 codes",
                               location=f"graph {graph.name}", hint="quantize with the quantize pass (packed u8)")
        else:
            tensors[param.name] = torch.from_numpy(np.ascontiguousarray(array))
    for name, array in planner.weights.items():
        tensors[name] = torch.from_numpy(array)
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()


def _weights(graph: Graph) -> list[Param]:
    used = {v.name: v for n in graph.nodes for v in n.inputs if isinstance(v, Param)}
    used.update({v.name: v for v in graph.outputs if isinstance(v, Param)})
    return [used[name] for name in sorted(used)]


# ---- the module text ---------------------------------------------------------------------

def module_source(graph: Graph, planner: Planner, *, source: str = "") -> str:
    parts = [_docstring(graph, planner, source),
             "from __future__ import annotations\n\nimport math\nimport os\n\nimport numpy as np\nimport torch\n"
             + ("import torch.distributed as dist\n" if world_size(graph) else "")
             + "import triton\nimport triton.language as tl",
             SETTINGS + _world_line(graph), CONFIGS_TEXT]
    parts.append(_rule("kernels"))
    if "tanh_f32" in planner.helpers:
        parts.append(TANH_HELPER)
    for kernel in planner.kernels.values():
        parts.append(wrap_code(kernel.source.replace(NODES_MARKER, _node_list(kernel.nodes))))
    parts.append(_rule("launch helpers"))
    parts += [wrap_code(kernel.launcher) for kernel in planner.kernels.values() if kernel.launcher]
    parts += [wrap_code(text) for text in planner.launchers.values()]
    parts.append(_rule("torch helpers (the launcher's non-kernel work)"))
    helpers = ["to_device", "present_cache", *sorted(h for h in planner.helpers if h in TORCH_HELPERS)]
    parts += [TORCH_HELPERS[h] for h in helpers]
    parts += [fallback.HELPERS[h] for h in sorted(planner.helpers) if h in fallback.HELPERS]
    parts += [collective.HELPERS[h] for h in collective.HELPERS if h in planner.helpers]
    parts.append(_rule("the graph"))
    sharded = bool(world_size(graph))
    parts += [collective.load_weights_text() if sharded else _load_weights(), _forward(graph, planner),
              _session(graph), _specs(planner), COMPILE_TEXT,
              'if __name__ == "__main__":\n' + (collective.MAIN_TEXT if sharded else "") +
              "    session = Session(batch=1, capacity=16)\n"
              "    logits = session(torch.tensor([[1, 2, 3]]))[\"logits\"]\n"
              "    print(\"prefill logits\", tuple(logits.shape), \"device\", DEVICE)"
              + (collective.MAIN_END if sharded else "")]
    return "\n\n\n".join(part.rstrip("\n") for part in parts) + "\n"


def _world_line(graph: Graph) -> str:
    world = world_size(graph)
    return f"\n# ranks of the world this module is one rank's program of (shard{{tp={world}}})\nWORLD_SIZE = {world}" \
        if world else ""


def _rule(title: str) -> str:
    return f"# ---- {title} ".ljust(96, "-")


def _node_list(names: list[str]) -> str:
    """Node names, layer stacks folded: %layers.*.q (x32)."""
    counts: dict[str, int] = {}
    for name in names:
        key = re.sub(r"(^|\.)layers\.\d+\.", r"\1layers.*.", name)
        counts[key] = counts.get(key, 0) + 1
    items = [f"%{key}" + (f" (x{count})" if count > 1 else "") for key, count in counts.items()]
    lines, line = [], ""
    for item in items:
        if line and len(line) + len(item) + 2 > 84:
            lines.append(line + ",")
            line = item
        else:
            line = f"{line}, {item}" if line else item
    lines.append(line)
    return "\n        ".join(lines)


def _docstring(graph: Graph, planner: Planner, source: str) -> str:
    origin = f" from {source}" if source else ""
    kernels = [f"    {kernel.name}: {_node_list(kernel.nodes)}" for kernel in planner.kernels.values()]
    torch_ops: dict[str, list] = {}
    for step in planner.steps:
        for op in step.torch_ops:
            torch_ops.setdefault(op, []).extend(node.name for node in step.nodes)
    pasts = [v for v in graph.inputs if v.name.startswith("past_key_values.")]
    torch_lines = []
    if any("P" in dims.symbols(d) for v in pasts for d in v.shape):
        torch_lines.append("    present caches: past K/V copied into new present buffers (not with a Session)")
    if any(not any("P" in dims.symbols(d) for d in v.shape) for v in pasts):
        torch_lines.append("    recurrent states: each past state read whole, its present state a new tensor")
    for op, names in torch_ops.items():
        if op == "rope tables":
            torch_lines.append("    rope tables: cos/sin of position_ids x inv_freq, once per forward per RoPE "
                               "configuration")
        else:
            torch_lines.append(f"    {op}: {_node_list(names)}")
    folded = list(getattr(planner, "dequantized", {}))
    if folded:
        kernels.append(f"    (decoded inside the GEMMs that read them) dequantize: {_node_list(folded)}")
    return "\n".join([
        f'"""{graph.name}: Triton kernels and their launcher, generated by irc{origin}.',
        "",
        "    W = load_weights()                          # the .pt beside this file, on DEVICE",
        "    outputs = forward(W, **inputs)              # graph inputs by name -> outputs by name",
        "    session = Session(W, batch=1, capacity=64)  # a KV cache held on the device",
        "    logits = session(input_ids)[\"logits\"]       # the prompt, then one call per new token",
        "",
        *interface_lines(graph),
        "",
        "Needs torch and triton, not irc. Runs on a CUDA GPU, or on CPU through Triton's",
        "interpreter: set TRITON_INTERPRET=1 before importing this module.",
        "",
        "Generated kernels (the graph nodes each implements):", *kernels,
        "Torch ops in the launcher (not generated kernels):", *torch_lines,
        "Generated code: regenerate rather than edit.",
        '"""'])


def _load_weights() -> str:
    return '''def load_weights(path=None, device=None):
    """The weights by param name (torch tensors on ``device``, default DEVICE), from ``path``
    or the .pt beside this module."""
    if path is None:
        path = os.path.splitext(os.path.abspath(__file__))[0] + ".pt"
    return torch.load(path, map_location=device or DEVICE, weights_only=True)'''


def _bind_symbols(graph: Graph, var) -> list[str]:
    """Lines binding the symbols from input shapes, as ``irc.dims.binding_plan`` says."""
    by_name = {v.name: v for v in graph.inputs}
    return [f"{symbol} = " + dims.solve_text(f"{var(by_name[name])}.shape[{axis}]", rest, coefficient)
            for symbol, name, axis, rest, coefficient in dims.binding_plan(graph.inputs)]


def _forward(graph: Graph, planner: Planner) -> str:
    symbols = {s for value in graph.inputs for dim in value.shape for s in dims.symbols(dim)}
    for symbol in sorted(symbols):
        if keyword.iskeyword(symbol) or symbol in planner.taken:
            raise BackendError(f"symbol {symbol!r} cannot be a variable of the emitted forward()",
                               location=f"graph {graph.name}", hint="rename the dimension symbol")
    planner.taken |= symbols
    body = [f"{planner.var(v)} = to_device(inputs[{v.name!r}])  # {v.type_str()}" for v in graph.inputs]
    body += _bind_symbols(graph, planner.var)
    body += planner.prologue
    for step in planner.steps:
        body.append("")
        body += ["# " + format_node(node) for node in step.nodes]
        body += step.lines
    results = [f"{v.name!r}: {planner.var(v)}," for v in graph.outputs]
    lines = ["def forward(W, /, kv_storage=None, **inputs):",
             '    """Run the graph: W from load_weights(), inputs by graph input name; returns the',
             "    graph outputs by name. ``kv_storage`` (a Session's) maps each past-cache input to a",
             "    preallocated [B, K, capacity, D] buffer whose first P positions hold the past. A",
             "    recurrent state (past_key_values.* without the position axis: conv and scan states)",
             '    is read whole and its present.* output is a new tensor of the same shape."""',
             '    if DEVICE.type == "cpu" and not INTERPRETED:',
             '        raise RuntimeError("no CUDA GPU: set TRITON_INTERPRET=1 before importing this module to run '
             'its kernels on CPU")']
    lines += ["    " + line if line else "" for line in body]
    lines += ["    return {", *[f"        {r}" for r in results], "    }"]
    return wrap_code("\n".join(lines))


def _session(graph: Graph) -> str:
    caches, states = {}, {}
    for value in graph.inputs:
        if not value.name.startswith("past_key_values."):
            continue
        axis = [i for i, d in enumerate(value.shape) if d == "P"]
        if axis:
            shape = tuple("batch" if d == "B" else "capacity" if d == "P" else d for d in value.shape)
            caches[value.name] = (shape, axis[0], torch_type(value.dtype))
        else:  # a recurrent state of fixed size (conv, scan): passed whole, returned whole
            shape = tuple("batch" if d == "B" else d for d in value.shape)
            states[value.name] = (shape, torch_type(value.dtype))
    entries = [f"    {name!r}: ({shape!r}, {axis}, {dtype}),"
               for name, (shape, axis, dtype) in caches.items()]
    state_entries = [f"    {name!r}: ({shape!r}, {dtype})," for name, (shape, dtype) in states.items()]
    names = [v.name for v in graph.inputs]
    return "\n".join([
        "# per past-cache input: (its buffer's shape in a Session, the position axis, dtype)",
        "CACHES = {", *entries, "}",
        "# per recurrent-state input (no position axis): (its shape in a Session, dtype)",
        "STATES = {", *state_entries, "}",
        "INPUT_NAMES = " + _pretty(names, 0).lstrip(),
        "",
        "",
        "class Session:",
        '    """The weights and a preallocated KV cache of ``capacity`` positions on DEVICE. Call it',
        "    with new token ids [B, T] -- the prompt, then one token per step; it returns the graph",
        "    outputs. Attention writes the new K/V rows straight into the storage (the present",
        "    caches are views of it); caches the graph computes (int8 codes) are copied in.",
        "    Recurrent states (conv and scan states, fixed size) start at zero and are fed whole;",
        '    each present state is copied over its buffer after the step."""',
        "",
        "    def __init__(self, W=None, batch=1, capacity=256):",
        "        self.W = load_weights() if W is None else W",
        "        self.capacity, self.length = capacity, 0",
        "        self.storage, self.axes = {}, {}",
        "        for name, (shape, axis, dtype) in CACHES.items():",
        "            shape = tuple({\"batch\": batch, \"capacity\": capacity}.get(d, d) for d in shape)",
        "            self.storage[name] = torch.zeros(shape, device=DEVICE, dtype=dtype)",
        "            self.axes[name] = axis",
        "        self.states = {name: torch.zeros(tuple(batch if d == \"batch\" else d for d in shape), device=DEVICE,",
        "                                         dtype=dtype) for name, (shape, dtype) in STATES.items()}",
        "",
        "    def __call__(self, input_ids, attention_mask=None):",
        "        ids = to_device(input_ids)",
        "        batch, new = ids.shape",
        "        past = self.length",
        "        if past + new > self.capacity:",
        '            raise ValueError(f"{past + new} positions exceed the cache capacity {self.capacity}")',
        "        if attention_mask is None:",
        "            attention_mask = torch.ones((batch, past + new), dtype=torch.int64, device=DEVICE)",
        "        positions = torch.arange(past, past + new, device=DEVICE).expand(batch, new).contiguous()",
        '        feeds = {"input_ids": ids, "attention_mask": to_device(attention_mask), "position_ids": positions}',
        "        for name, buffer in self.storage.items():",
        "            feeds[name] = buffer.narrow(self.axes[name], 0, past)",
        "        feeds.update(self.states)",
        "        outputs = forward(self.W, kv_storage=self.storage,",
        "                          **{name: value for name, value in feeds.items() if name in INPUT_NAMES})",
        "        for name, buffer in self.storage.items():",
        '            present = outputs["present." + name[len("past_key_values."):]]',
        "            if present.data_ptr() != buffer.data_ptr():",
        "                buffer.narrow(self.axes[name], past, new).copy_(present.narrow(self.axes[name], past, new))",
        "        for name, buffer in self.states.items():",
        '            buffer.copy_(outputs["present." + name[len("past_key_values."):]])',
        "        self.length = past + new",
        "        return outputs"])


def _specs(planner: Planner) -> str:
    lines = ["# every kernel's triton.compile signature, constexprs for a compile check, and the",
             "# type overrides of its tensor-core check (None: no tl.dot; the check turns MIXED on)",
             "KERNEL_SPECS = {"]
    for kernel in planner.kernels.values():
        tensor = repr(kernel.tensor_core_types) if kernel.tensor_cores else "None"
        lines += [f"    {kernel.name!r}: (", _pretty(kernel.signature, 8) + ",", _pretty(kernel.constexprs, 8) + ",",
                  f"        {tensor}),"]
    lines.append("}")
    return "\n".join(lines)


def _pretty(value, indent: int) -> str:
    """A flat dict or list literal, its items packed into lines of the module's width."""
    items = [f"{k!r}: {v!r}" for k, v in value.items()] if isinstance(value, dict) else [repr(v) for v in value]
    opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
    lines, current = [], " " * indent + opening
    for item in items:
        if len(current) + len(item) + 2 > WRAP and current.strip() != opening:
            lines.append(current.rstrip())
            current = " " * (indent + 1)
        current += item + ", "
    return "\n".join(lines + [current.rstrip().rstrip(",") + closing])


COMPILE_TEXT = '''def compile_kernels(capability=90, *, tensor_cores=False, names=None):
    """Compile kernels for an NVIDIA GPU of compute capability ``capability`` (80: A100,
    90: H100) with no GPU present; returns {name: compiled} (``.asm["ptx"]`` is the PTX).
    With ``tensor_cores`` the kernels that use tl.dot are compiled with MIXED on (their
    dots in 16 bits: a tensor-core check) and the others skipped. Run it without
    TRITON_INTERPRET."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if INTERPRETED:
        raise RuntimeError("compile_kernels needs the real compiler: unset TRITON_INTERPRET")
    compiled = {}
    for name, (signature, constexprs, tensor_types) in KERNEL_SPECS.items():
        if (names is not None and name not in names) or (tensor_cores and tensor_types is None):
            continue
        fn = globals()[name]
        while not isinstance(fn, triton.runtime.JITFunction):
            fn = fn.fn  # autotuned kernels wrap the JIT function
        if tensor_cores:  # the kernel as emitted, with MIXED_DOT on
            signature, constexprs = {**signature, **tensor_types}, {**constexprs, "MIXED": True}
        source = ASTSource(fn, signature, constexprs)
        compiled[name] = triton.compile(source, target=GPUTarget("cuda", capability, 32))
    return compiled'''


def emit_target(graph: Graph, path: str, options) -> list[str]:
    """``--target triton`` (``backends.TARGETS``); imports torch and triton."""
    emit_module(graph, path, source=options.source)
    world = world_size(graph)
    if world:
        return [f"wrote {path} (one rank's Triton module of a {world}-rank world (+ one .rank{{r}}.pt weights file "
                f"a rank); run it: irc run {os.path.dirname(path) or '.'} --tp {world})"]
    return [f"wrote {path} (a Triton module: generated kernels + launcher (+ .pt weights))"]
