"""One worker harness for every real run (PyTorch and DeepSpeed alike): build the model, spawn
ranks, collect their per-rank records (needs PyTorch).

:func:`spawn` starts ``workers`` processes on 127.0.0.1 and returns what each rank's ``target``
returned. The parent serves the rendezvous store on a port the OS picks and keeps it bound, so
no other program can take the port between choosing it and the ranks connecting; each rank
joins it through ``env://`` as a client (``TORCHELASTIC_USE_AGENT_STORE``), whether the process
group is created by :func:`join_gloo` or by ``deepspeed.init_distributed``.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from zerolib.crosscheck.validation.setups import ModelSpec

HOST = "127.0.0.1"
TIMEOUT = datetime.timedelta(seconds=120)


def build_linear_stack(spec: ModelSpec, seed: int = 0) -> tuple[nn.Sequential, list[nn.Linear]]:
    """``spec``'s Linear layers with ReLU between them, the same initial weights on every rank."""
    torch.manual_seed(seed)
    layers = [nn.Linear(inp, out) for inp, out in zip(spec.widths, spec.widths[1:])]
    modules: list[nn.Module] = []
    for index, layer in enumerate(layers):
        modules += [layer] if index == len(layers) - 1 else [layer, nn.ReLU()]
    return nn.Sequential(*modules), layers


def join_gloo() -> None:
    """Join the run's process group with gloo (the rank and the store come from the environment)."""
    dist.init_process_group("gloo", init_method="env://", timeout=TIMEOUT)


def _rank_main(rank: int, workers: int, port: int, out_dir: str, target, args: tuple) -> None:
    torch.set_num_threads(1)  # several ranks share two cores
    os.environ.update(MASTER_ADDR=HOST, MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(workers), LOCAL_RANK=str(rank), LOCAL_SIZE=str(workers),
                      TORCHELASTIC_USE_AGENT_STORE="True")
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # stay on loopback
    try:
        record = target(rank, workers, *args)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(record))
        dist.barrier()  # every rank has written its record
    except BaseException:
        if dist.is_initialized():
            dist.destroy_process_group()
        raise
    # Done: leave without the interpreter's teardown. Destroying gloo's and the store's C++
    # threads at exit sometimes aborts the process ("terminate called without an active
    # exception", SIGABRT; seen about once in 20 runs here) after all the work is done.
    os._exit(0)


def spawn(target, workers: int, *args) -> list:
    """Run ``target(rank, workers, *args)`` in ``workers`` fresh processes; the list of what each
    rank returned (JSON-serialisable), by rank. ``target`` joins the process group itself
    (:func:`join_gloo`, or DeepSpeed's ``init_distributed``) and must be importable by name."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 2:
        raise ValueError(f"workers must be a whole number of processes >= 2, got {workers!r}")
    store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    with tempfile.TemporaryDirectory(prefix="zerolib-run-") as out_dir:
        mp.start_processes(_rank_main, args=(workers, store.port, out_dir, target, args),
                           nprocs=workers, join=True, start_method="spawn")
        return [json.loads(Path(out_dir, f"rank{rank}.json").read_text()) for rank in range(workers)]
