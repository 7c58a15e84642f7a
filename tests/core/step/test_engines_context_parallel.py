"""Which engines run ring-attention context parallelism (Engine.context_parallel): Megatron-LM
(--context-parallel-size) and FSDP2 with torchtitan (context_parallel over dp_shard x cp);
DeepSpeed 0.19.8 has Ulysses' all-to-all instead, and the ZeRO paper's schedule has none."""
from __future__ import annotations

from zerolib.core.step.engines import CONTEXT_PARALLEL_ENGINES, ENGINES, get_engine


def test_only_megatron_and_fsdp2_run_it():
    assert {name: e.context_parallel for name, e in ENGINES.items()} == {
        "paper": False, "deepspeed": False, "fsdp2": True, "megatron": True, "torchtitan": True}
    assert CONTEXT_PARALLEL_ENGINES == ("fsdp2", "megatron", "torchtitan")


def test_flags_keep_it():
    assert get_engine("megatron").with_flags(overlap_grad_reduce=True).context_parallel
    assert not get_engine("deepspeed").with_flags(overlap_comm=True).context_parallel


def test_it_is_stated_and_cited():
    for name, e in ENGINES.items():
        assert e.as_dict()["context_parallel"] is e.context_parallel, name
    # Each engine's sources say where its answer comes from (the paper's: its silence).
    for name, where in (("fsdp2", "_context_parallel/_attention.py context_parallel"),
                        ("megatron", "--context-parallel-size"),
                        ("deepspeed", "deepspeed/sequence/layer.py DistributedAttention")):
        assert any(where in key or where in value
                   for key, value in ENGINES[name].sources.items()), name
