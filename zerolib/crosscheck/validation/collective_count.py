"""Count what one rank hands to each collective while some code runs (needs PyTorch).

The PyTorch profiler records every gloo collective as an event named ``gloo:<op>`` whose
``Input Dims`` and ``Input type`` give the elements and dtype of each tensor the rank hands to
it (recorded with ``record_shapes=True``). This sees what Python-level wrappers around
``torch.distributed`` miss, such as the collectives DDP's C++ reducer issues. The counted code
ends with a barrier, which gloo runs only after every collective issued before it has finished,
so none is still in flight when the profiler stops; the barrier itself is not counted.
"""
from __future__ import annotations

import json
import os
import tempfile
from math import prod

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

# gloo event -> the kind of collective it is.
GLOO_KINDS = {"gloo:all_reduce": "all_reduce", "gloo:reduce_scatter": "reduce_scatter",
              "gloo:all_gather": "all_gather", "gloo:broadcast": "broadcast",
              "gloo:all_to_all": "all_to_all"}   # all_to_all_single (expert parallelism)
IGNORED = {"gloo:barrier"}
# The profiler's names for dtypes (c10 scalar type names) -> bytes per element.
DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8,
               "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1}


def _events(prof) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="zerolib-trace-") as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as stream:
            return json.load(stream)["traceEvents"]


def _handed_bytes(event: dict) -> int:
    args = event.get("args", {})
    dims, types = args.get("Input Dims"), args.get("Input type")
    if dims is None or types is None:
        raise ValueError(f"{event['name']} was recorded without shapes (record_shapes=True?)")
    total = 0
    for shape, dtype in zip(dims, types):
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"{event['name']} hands a tensor of unknown dtype {dtype!r}")
        total += prod(shape) * DTYPE_BYTES[dtype]
    return total


def count_collectives(run) -> dict[str, tuple[int, int]]:
    """Call ``run()`` under the profiler, then a barrier; per kind of collective, (calls, bytes
    handed) by this rank. A gloo collective of another kind is an error, not a silent omission."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
        dist.barrier()
    counts = {kind: [0, 0] for kind in GLOO_KINDS.values()}
    for event in _events(prof):
        name = event.get("name", "")
        if not name.startswith("gloo:") or name in IGNORED or event.get("ph") != "X":
            continue
        if name not in GLOO_KINDS:
            raise ValueError(f"a collective this count does not know: {name}")
        counts[GLOO_KINDS[name]][0] += 1
        counts[GLOO_KINDS[name]][1] += _handed_bytes(event)
    return {kind: (calls, n_bytes) for kind, (calls, n_bytes) in counts.items()}
