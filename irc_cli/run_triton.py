"""``irc run`` of a Triton folder (``irc_triton.json`` beside the module ``irc compile
--target triton`` wrote): one process per rank, each running the module's greedy loop.

    irc compile examples/tiny-llama3.yaml --target triton --passes "dce,cse,shard{tp=2}" -o out/model_tt.py
    irc run out --tp 2 --prompt-ids 1,2,3

A folder compiled with ``shard{tp=N}`` holds one rank's program and one weights file a rank;
``--tp N`` (or nothing: the folder's world) starts N processes (``python -m irc_cli.run_triton
RANK JOB``: fresh interpreters that do not import the caller's ``__main__``, as
multiprocessing's spawn would) joined in a ``torch.distributed`` process group over a local
TCP port: NCCL where CUDA has a GPU a rank, gloo on CPU, where the kernels run in Triton's
interpreter (``TRITON_INTERPRET=1`` set before triton loads). Every rank decodes the same
tokens (the logits are all-gathered, so all ranks agree); rank 0 sends them on its stdout
as they come (``PREFIX`` + JSON lines), and the last logits at the end. An unsharded folder
runs in one process. A rank that fails stops the others; its error is the one reported.
"""
from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
from datetime import timedelta

import numpy as np

from irc.errors import IRCError
from irc.inputs import read_json

MANIFEST = "irc_triton.json"  # backends.triton.emit.MANIFEST
PREFIX = "irc-rank "  # a line a rank sends the launcher: PREFIX + JSON
JOIN_S = 60  # seconds the ranks get to finish after rank 0 is done, before they are stopped


def read_manifest(folder: str) -> dict:
    return read_json(os.path.join(folder, MANIFEST))


def check_world(spec: str, folder, tp: int) -> None:
    """``--tp N``: ``folder`` (the compiled folder or None) is a Triton folder sharded N ways."""
    hint = f"irc compile SPEC --target triton --passes \"dce,cse,shard{{tp={tp}}}\" -o OUT/model_tt.py"
    if tp < 1:
        raise IRCError(f"--tp {tp}: a world has at least one rank")
    if folder is None or not os.path.isfile(os.path.join(folder, MANIFEST)):
        raise IRCError(f"--tp {tp} runs a Triton folder compiled with shard{{tp={tp}}}, and this is not one",
                       location=spec, hint=hint)
    world = int(read_manifest(folder).get("world", 1))
    if world == 1 and tp > 1:
        raise IRCError(f"--tp {tp}: this Triton folder was compiled without the shard pass (one rank)",
                       location=folder, hint=hint)
    if world != tp:
        raise IRCError(f"--tp {tp}: this Triton folder was compiled for {world} ranks (shard{{tp={world}}})",
                       location=folder, hint=f"run it with --tp {world}, or compile it again: {hint}")


def run(folder, prompt, max_new_tokens, eos, clock, engine: str = "auto", speculative=None):
    """(tokens, engine name, last logits) of the folder's module in its world of processes."""
    if speculative is not None:
        raise IRCError("--speculative: a Triton folder runs its own greedy loop", location=folder,
                       hint="run it without --speculative")
    if engine == "genai":
        raise IRCError("--engine genai runs an ONNX folder; this is a Triton folder", location=folder)
    manifest = read_manifest(folder)
    world = int(manifest.get("world", 1))
    backend = _backend(world)
    job = {"world": world, "module": os.path.join(os.path.abspath(folder), manifest["module"]),
           "prompt": list(prompt), "max_new_tokens": max_new_tokens, "eos": sorted(eos), "port": _free_port()}
    messages: queue.Queue = queue.Queue()
    ranks = [_start(rank, job, backend, messages) for rank in range(world)]
    finished = False
    try:
        tokens, logits = _receive(messages, ranks, clock, folder)
        finished = True
    finally:
        _stop(ranks, JOIN_S if finished else 0)
    name = "triton" if world == 1 else f"triton, {world} ranks ({backend})"
    return tokens, name + (", interpreted" if backend != "nccl" else ""), logits


def _backend(world: int) -> str:
    import torch

    if not torch.cuda.is_available():
        return "gloo"
    if torch.cuda.device_count() < world:
        raise IRCError(f"{world} ranks need a GPU each; CUDA has {torch.cuda.device_count()}",
                       hint="run on a machine with enough GPUs, or hide them (CUDA_VISIBLE_DEVICES=) to run on CPU")
    return "nccl"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(rank: int, job: dict, backend: str, messages: queue.Queue) -> subprocess.Popen:
    """Rank ``rank``'s process (``python -m irc_cli.run_triton``); a thread forwards the
    lines it sends (``PREFIX`` + JSON) to ``messages`` as (rank, message)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # irc_cli's parent: importable there
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    if backend == "gloo":
        env["TRITON_INTERPRET"] = "1"  # read when the module defines its kernels
    process = subprocess.Popen([sys.executable, "-m", "irc_cli.run_triton", str(rank), json.dumps(job)], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.errors = []  # its stderr's last lines, for a failure without a message

    def forward(stream, errors: bool) -> None:
        for line in stream:
            if errors:
                process.errors = (process.errors + [line.rstrip()])[-8:]
            elif line.startswith(PREFIX):
                messages.put((rank, json.loads(line[len(PREFIX):])))

    process.readers = [threading.Thread(target=forward, args=(stream, errors), daemon=True)
                       for stream, errors in ((process.stdout, False), (process.stderr, True))]
    for reader in process.readers:
        reader.start()
    return process


def _receive(messages: queue.Queue, ranks, clock, folder) -> tuple:
    """Rank 0's tokens as they come (to ``clock``) and its last logits; a rank's error raised."""
    tokens = []
    while True:
        try:
            rank, message = messages.get(timeout=1.0)
        except queue.Empty:
            dead = [(rank, p) for rank, p in enumerate(ranks) if p.poll() not in (None, 0)]
            if dead:
                rank, process = dead[0]
                tail = "; ".join(process.errors[-3:])
                raise IRCError(f"rank {rank} exited with code {process.returncode}" + (f": {tail}" if tail else ""),
                               location=folder) from None
            if all(p.poll() == 0 and not any(r.is_alive() for r in p.readers) for p in ranks) and messages.empty():
                raise IRCError("the ranks finished without a result", location=folder) from None
            continue
        if "error" in message:
            raise IRCError(f"rank {rank}: {message['error']}", location=folder)
        if "start" in message:
            clock.start()
        elif "token" in message:
            tokens.append(message["token"])
            clock.token(message["token"])
        elif "logits" in message:
            return tokens, np.asarray(message["logits"], dtype=np.float32)


def _stop(ranks, wait: float) -> None:
    """Wait for the ranks (``wait`` seconds each: 0 after a failure); stop those still running."""
    for process in ranks if wait else ():
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
    for process in ranks:
        if process.poll() is None:  # stuck in a collective a failed rank never joined
            process.terminate()
            process.wait()


def rank_main(rank: int, job: dict) -> int:
    """One rank's process: the process group, the module, the greedy loop (rank 0 reports
    its tokens; every rank its error)."""
    channel, sys.stdout = sys.stdout, sys.stderr  # the module's prints do not mix with the messages

    def send(**message) -> None:
        channel.write(PREFIX + json.dumps(message) + "\n")
        channel.flush()

    import torch

    if not torch.cuda.is_available():
        from backends.triton.interpreter import use_interpreter
        use_interpreter()  # before the module defines its kernels
    import torch.distributed as dist

    world, prompt, steps = job["world"], job["prompt"], job["max_new_tokens"]
    try:
        if world > 1:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(rank)
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{job['port']}", rank=rank,
                                    world_size=world, timeout=timedelta(seconds=600))
        from backends.triton.emit import load_module

        module = load_module(job["module"])
        session = module.Session(module.load_weights(), batch=1, capacity=len(prompt) + steps)
        _greedy(session, prompt, steps, set(job["eos"]), send if rank == 0 else None)
    except Exception as err:  # noqa: BLE001  (reported to the parent: the process fails with it)
        send(error=f"{type(err).__name__}: {err}")
        return 1
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0


def _greedy(session, prompt: list, max_new_tokens: int, eos: set, send) -> None:
    """The greedy loop through ``session`` (the prompt, then a token a call); ``send``
    (rank 0's): start, each token, and the last logits."""
    import torch

    if send is not None:
        send(start=True)
    ids, tokens, last = torch.tensor([prompt], dtype=torch.int64), [], None
    while len(tokens) < max_new_tokens:
        last = session(ids)["logits"][0, -1].float().cpu().numpy()
        token = int(np.argmax(last))
        tokens.append(token)
        if send is not None:
            send(token=token)
        if token in eos:
            break
        ids = torch.tensor([[token]], dtype=torch.int64)
    if send is not None:
        send(logits=[float(x) for x in last])


if __name__ == "__main__":  # one rank: python -m irc_cli.run_triton RANK JOB_JSON (started by run())
    sys.exit(rank_main(int(sys.argv[1]), json.loads(sys.argv[2])))
