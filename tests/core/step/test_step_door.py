"""The step room checks its inputs once, at its doors (ring_timing, offload_seconds,
ParallelSettings), and times what they checked without checking again (issue 19). Checks are
counted with sys.setprofile as tests/chapter/explorers/test_planner_door_counts.py counts them;
the expected times are worked out by hand from NCCL's constants: 8.4 us per collective, 3.4 us
per NVLink step, 14.0 us per network step, NVLink 3 300 GB/s per direction (a DGX A100 of 8)."""
import sys
from collections import Counter

import numpy as np
import pytest

from zerolib.core.catalogue.nodes import interconnect
from zerolib.core.memory.activations import RECOMPUTE
from zerolib.core.planner import PASSES, enumerate_space, plan_settings
from zerolib.core.step.collectives import ring_timing, ring_timing_of
from zerolib.core.step.parallel import (
    OFFLOADS,
    ParallelSettings,
    cluster_interconnect,
    offload_seconds,
    parallel_step_time,
)
from zerolib.core.units import GiB

P7 = 6_738_415_616        # Llama-2-7B parameters
US = 1e-6


def count_checks(call) -> Counter:
    counts = Counter()

    def profile(frame, event, arg):
        if event != "call":
            return
        name = frame.f_code.co_name
        if (frame.f_globals.get("__name__") == "zerolib.core.inputs"
                or name.startswith(("check_", "_check_"))):
            counts[name] += 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return counts


def settings(groups: int) -> ParallelSettings:
    """``groups`` distinct (shard group, offload) pairs of stage-3 data parallelism on 64 GPUs."""
    pairs = [(g, off) for g in (1, 2, 4, 8, 16, 32, 64) for off in ("none", "optimizer",
                                                                   "optimizer+parameters")][:groups]
    return ParallelSettings(seq_len=4096, micro_batch=1, tensor_parallel=1, pipeline_parallel=1,
                            data_parallel=64, stage=3, micro_batches=2, mfu=0.5,
                            shard_group=[g for g, _ in pairs],
                            offload=np.array([off for _, off in pairs], dtype=object))


def test_the_timing_of_checked_settings_checks_nothing_per_group():
    # Before: every shard group and offload of the call re-checked its traffic (about 20 checks
    # per group) and every ring its size (22 rings, 6 checks each).
    ic = cluster_interconnect("dgx-a100", 8, efficiency="line-rate")
    one, many = settings(1), settings(21)
    for warm in (one, many):   # the compute rule and each offload's placement: made once
        parallel_step_time("llama-2-7b", ic, "a100-80gb", warm)
    few = count_checks(lambda: parallel_step_time("llama-2-7b", ic, "a100-80gb", one))
    lots = count_checks(lambda: parallel_step_time("llama-2-7b", ic, "a100-80gb", many))
    assert few == lots, (few, lots)
    assert sum(lots.values()) <= 2, lots     # the parallelism rules, once per call


def test_ring_timing_of_times_a_checked_ring_as_ring_timing_does():
    ic = interconnect("dgx-a100", efficiency="line-rate")
    # An all-reduce over the 8 GPUs of one node: 8.4 us + 2 x 7 NVLink steps of 3.4 us.
    latency, bandwidth = ring_timing_of(ic, "all_reduce", np.int64(8))
    assert float(latency) == pytest.approx((8.4 + 14 * 3.4) * US)
    assert float(bandwidth) == pytest.approx(300e9)
    # Over 16 GPUs on two nodes: 2 x 15 steps, 2 x 1 of them across the network; once the ring
    # spans nodes, NCCL (tuning.cc) charges each of the 28 steps inside a node at least 3 x the
    # AMD host's 2 us network overhead: max(3.4, 6.0) = 6.0 us.
    latency, _ = ring_timing_of(ic, "all_reduce", np.int64(16))
    assert float(latency) == pytest.approx((8.4 + 28 * 6.0 + 2 * 14.0) * US)
    sizes = np.array([1, 2, 8, 16, 64])
    for kind in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        assert all(np.array_equal(a, b) for a, b in zip(ring_timing(ic, kind, sizes, 2),
                                                        ring_timing_of(ic, kind, sizes, 2)))


def test_ring_timing_still_checks_at_its_door():
    ic = interconnect("dgx-a100", efficiency="line-rate")
    with pytest.raises(ValueError, match="kind must be one of all_reduce, reduce_scatter, "
                                         "all_gather, all_to_all, got 'broadcast'"):
        ring_timing(ic, "broadcast", 8)
    with pytest.raises(ValueError, match="gpus must be a positive whole number of workers"):
        ring_timing(ic, "all_reduce", 0)


def test_settings_refuse_a_shard_group_that_does_not_divide_when_built():
    # Before: built, and refused only when timed, deep in the shard group's traffic.
    with pytest.raises(ValueError, match=r"shard_group must divide gpus .* got shard_group 3 "
                                         r"with gpus 8"):
        ParallelSettings(seq_len=4096, micro_batch=1, tensor_parallel=1, pipeline_parallel=1,
                         data_parallel=8, stage=1, micro_batches=1, shard_group=3)


def test_settings_refuse_an_offload_at_a_stage_that_does_not_offer_it_when_built():
    with pytest.raises(ValueError, match=r"offload_optimizer='cpu' needs ZeRO stage 1, 2 or 3, "
                                         r"got stage 0"):
        ParallelSettings(seq_len=4096, micro_batch=1, tensor_parallel=1, pipeline_parallel=1,
                         data_parallel=8, stage=[0, 1], micro_batches=1, offload="optimizer")
    with pytest.raises(ValueError, match=r"offload_params='cpu' needs ZeRO stage 3 \(only stage 3 "
                                         r"partitions parameters\), got stage 2"):
        ParallelSettings(seq_len=4096, micro_batch=1, tensor_parallel=1, pipeline_parallel=1,
                         data_parallel=8, stage=2, micro_batches=1, offload="optimizer+parameters")


def test_offload_seconds_checks_at_its_door():
    with pytest.raises(ValueError, match="shard_group must divide gpus"):
        offload_seconds(P7, 8, 3, "optimizer", shard_group=3)
    with pytest.raises(ValueError, match="offload_params='cpu' needs ZeRO stage 3"):
        offload_seconds(P7, 8, 1, "optimizer+parameters")
    with pytest.raises(ValueError, match="params must be a positive whole parameter count"):
        offload_seconds(0, 8, 3, "optimizer")
    with pytest.raises(ValueError, match="offload must be one of none, optimizer"):
        offload_seconds(P7, 8, 3, "disk")
    # A stage without offload is not judged: nothing moves.
    assert float(offload_seconds(P7, 8, 0, "none")["backward"]) == 0.0


def test_settings_from_the_planners_checked_space_are_the_checked_ones():
    s = plan_settings("llama-2-7b", 32, 8, "a100-80gb", 4096, 64, shard_groups="all",
                      host_memory=2048 * GiB)
    space = enumerate_space(s)
    runnable = space.reason == PASSES
    rows = {name: space.columns[name][runnable] for name in (
        "micro_batch", "tensor_parallel", "pipeline_parallel", "data_parallel", "stage",
        "micro_batches", "chunks", "sequence_parallel", "recompute", "shard_group", "offload")}
    assert len(np.unique(rows["shard_group"])) > 1 and len(np.unique(rows["offload"])) > 1
    common = dict(seq_len=s.seq_len, layout=s.layout, mfu=s.mfu,
                  element_bytes=s.working_set.element_bytes, host_link=s.host_link)
    trusted = ParallelSettings.from_checked(**common, **rows)
    checked = ParallelSettings(**common, **{**rows,
                               "recompute": np.asarray(RECOMPUTE, dtype=object)[rows["recompute"]],
                               "offload": np.asarray(tuple(OFFLOADS), dtype=object)[rows["offload"]]})
    for name in rows:
        a, b = getattr(trusted, name), getattr(checked, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name


def test_one_call_over_several_context_parallel_degrees_looks_up_and_checks_once():
    # The planner hands one call every C it searched (a degree per setting). Before, each degree
    # went back through parallel_step_time's door: the model looked up once more per degree
    # (and per stage for a mixture's experts) and each degree's compute rule checked again.
    from zerolib.core.catalogue.models import get_model
    config = get_model("mixtral-8x7b")
    ic = cluster_interconnect("dgx-a100", 8)
    degrees = np.array([1, 2, 4, 8])

    def settings_of(cp):
        return ParallelSettings(seq_len=6144, mfu=0.4, context_parallel=cp, micro_batch=1,
                                tensor_parallel=8, pipeline_parallel=1, data_parallel=8 * cp,
                                stage=1, micro_batches=4, sequence_parallel=True)

    many = ParallelSettings.from_checked(
        seq_len=6144, layout=settings_of(1).layout, mfu=0.4, element_bytes=2,
        host_link=settings_of(1).host_link, shard_group=None, recompute=0, offload=0,
        context_parallel=degrees, micro_batch=1, tensor_parallel=8, pipeline_parallel=1,
        data_parallel=8 * degrees, stage=1, micro_batches=4, sequence_parallel=True)
    looks = Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "get_model":
            looks["get_model"] += 1
        if event == "call" and (frame.f_globals.get("__name__") == "zerolib.core.inputs"
                                or frame.f_code.co_name.startswith(("check_", "_check_"))):
            looks[frame.f_code.co_name] += 1

    sys.setprofile(profile)
    try:
        times = parallel_step_time(config, ic, "a100-80gb", many)
    finally:
        sys.setprofile(None)
    # At the door, and the first time the model's layer units and experts' splits are read
    # (kept per model after): not once per degree and stage (before: 17).
    assert looks["get_model"] <= 3, looks
    assert looks["_check_rules"] == len(degrees), looks         # each C's rules: s / C differs
    assert sum(looks.values()) - looks["get_model"] - looks["_check_rules"] <= 3, looks  # the device
    # The same times as one call per degree through the door.
    for k, cp in enumerate(degrees.tolist()):
        one = parallel_step_time(config, ic, "a100-80gb", settings_of(cp))
        assert float(times.step_seconds[k]) == float(one.step_seconds)
        for name in times.parts:
            assert float(times.parts[name][k]) == float(one.parts[name]), name
