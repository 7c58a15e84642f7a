"""Persistent model state per worker: the seed's worksheet, its figure claims, and properties.

Expected values are worked out by hand from the ZeRO model: stage 0 replicates everything,
stage 1 divides the optimizer state by N, stage 2 also the gradients, stage 3 also the
parameters (Rajbhandari et al., SC20, Sec. V).
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerolib.core.memory.accounting import LAYOUTS, Layout, get_layout, model_state

GB = 10**9
A100_80GB = 80 * 2**30


def test_seed_worksheet_1b_params_on_4_workers():
    # 2 + 2 + 12 = 16 GB; 2 + 2 + 12/4 = 7; 2 + 2/4 + 12/4 = 5.5; (2 + 2 + 12)/4 = 4.
    state = model_state(1_000_000_000, 4, [0, 1, 2, 3])
    assert list(state.parameters) == [2 * GB, 2 * GB, 2 * GB, GB // 2]
    assert list(state.gradients) == [2 * GB, 2 * GB, GB // 2, GB // 2]
    assert list(state.optimizer) == [12 * GB, 3 * GB, 3 * GB, 3 * GB]
    assert list(state.total) == [16 * GB, 7 * GB, 5_500_000_000, 4 * GB]
    assert state.total[3] * 4 == state.total[0]
    # Four unsharded workers hold 64 GB together; fully partitioned they hold 16 GB.
    assert state.cluster_total[0] == 64 * GB and state.cluster_total[3] == 16 * GB


def test_fp32_gradients_change_the_total_and_the_stage2_saving():
    mixed = model_state(1_000_000_000, 4, [0, 1, 2], "mixed-adam").total
    fp32_grads = model_state(1_000_000_000, 4, [0, 1, 2], "bf16-fp32-grads").total
    # 2 + 4 + 12 = 18 GB unsharded (was 16); stage 1: 2 + 4 + 3 = 9; stage 2: 2 + 1 + 3 = 6.
    assert list(fp32_grads) == [18 * GB, 9 * GB, 6 * GB]
    # Partitioning gradients saves 4 * 3/4 = 3 GB instead of 2 * 3/4 = 1.5 GB.
    assert fp32_grads[1] - fp32_grads[2] == 3 * GB
    assert mixed[1] - mixed[2] == 1_500_000_000


def test_seed_figure_claims():
    gpus = np.arange(1, 65)
    # 7B: 7e9 * 16 bytes = 112 GB per GPU under plain data parallelism at every GPU count.
    assert np.all(model_state(7_000_000_000, gpus, 0).total == 112 * GB)
    # At 2 GPUs: stage 1 = 14 + 14 + 42 = 70 GB, stage 2 = 63, stage 3 = 56: all under 80 GiB.
    at_two = model_state(7_000_000_000, 2, [1, 2, 3]).total
    assert list(at_two) == [70 * GB, 63 * GB, 56 * GB] and np.all(at_two < A100_80GB)
    # 70B at 64 GPUs: 1120 GB baseline; stage 1 = 140 + 140 + 840/64 = 293.125 GB; stage 3 = 17.5 GB.
    big = model_state(70_000_000_000, 64, [0, 1, 3]).total
    assert list(big) == [1120 * GB, 293_125_000_000, 17_500_000_000]


def test_mixed_adam_parts_are_visible():
    layout = LAYOUTS["mixed-adam"]
    assert layout.widths() == (2, 2, 12) and layout.total == 16
    assert [width for _, width in layout.parts["optimizer"]] == [4, 4, 4]
    assert "master" in layout.parts["optimizer"][0][0]


@pytest.mark.parametrize("name, widths", [
    ("mixed-adam", (2, 2, 12)), ("fp32-adam", (4, 4, 8)), ("bf16-fp32-grads", (2, 4, 12)),
    ("adam-8bit", (2, 2, 6)), ("mixed-sgd-momentum", (2, 2, 8)),
])
def test_presets(name, widths):
    assert get_layout(name).widths() == widths


def test_custom_widths_including_fractional_bits():
    fp8 = Layout.custom(1, 1, 12, name="fp8")
    assert int(model_state(1000, 1, 0, fp8).total) == 14_000
    # 4-bit parameters: 1001 params * 0.5 bytes = 500.5 -> 501 whole bytes.
    nibble = Layout.custom(0.5, 0, 0)
    assert int(model_state(1001, 1, 0, nibble).parameters) == 501
    with pytest.raises(ValueError, match="bits"):
        Layout.custom(0.3, 2, 12)
    with pytest.raises(ValueError, match="non-negative"):
        Layout.custom(2, -2, 12)
    with pytest.raises(ValueError, match="non-negative"):
        Layout.custom(2, float("nan"), 12)
    with pytest.raises(ValueError, match="gradients width .* at most 64 bytes"):
        Layout.custom(2, 10**400, 12)          # a Python int too large for a float


def test_uneven_partition_counts_the_most_loaded_worker():
    # 10 parameters on 4 workers: shards of 3, 3, 2, 2 elements; the largest holds 3.
    state = model_state(10, 4, 3, "fp32-adam")
    assert int(state.parameters) == 12 and int(state.optimizer) == 24
    assert int(state.cluster_total) == 4 * (12 + 12 + 24)  # padding included


def test_vectorised_call_equals_pointwise_calls():
    params = np.array([1_000_000_000, 7_000_000_000, 13_000_000_000])[:, None, None]
    gpus = np.array([1, 3, 64])[None, :, None]
    stages = np.array([0, 1, 2, 3])[None, None, :]
    grid = model_state(params, gpus, stages).total
    assert grid.shape == (3, 3, 4) and grid.dtype == np.int64
    for i, p in enumerate(params.ravel()):
        for j, g in enumerate(gpus.ravel()):
            for k, s in enumerate(stages.ravel()):
                assert grid[i, j, k] == model_state(int(p), int(g), int(s)).total


@pytest.mark.parametrize("params", [-1, 0, float("nan"), float("inf"), -float("inf"), 1.5, [1, 0]])
def test_bad_params(params):
    with pytest.raises(ValueError, match="params"):
        model_state(params, 4, 0)


@pytest.mark.parametrize("params", ["7B", None, True, [[1, 2], [3]]])
def test_params_of_the_wrong_type(params):
    with pytest.raises(TypeError, match="params"):
        model_state(params, 4, 0)


@pytest.mark.parametrize("gpus, error", [(0, ValueError), (-4, ValueError), (2.5, ValueError),
                                         (float("nan"), ValueError), (True, TypeError),
                                         ("8", TypeError), (2**30, ValueError)])
def test_bad_gpus(gpus, error):
    with pytest.raises(error, match="gpus"):
        model_state(1000, gpus, 0)


@pytest.mark.parametrize("stage", [-1, 4, 1.5, 7, float("nan"), 2**63, 1e300])
def test_bad_stage(stage):
    with pytest.raises(ValueError, match="stage must be 0, 1, 2 or 3"):
        model_state(1000, 4, stage)


def test_limits_are_stated_exactly():
    # MAX_GPUS = 2**24 = 16,777,216 workers; one more is refused with the exact limit.
    assert int(model_state(1000, 16_777_216, 3).parameters) == 2           # ceil(1000 / 2**24) x 2
    with pytest.raises(ValueError, match="gpus must be at most 16,777,216"):
        model_state(1000, 16_777_217, 3)
    with pytest.raises(ValueError, match="params must be at most 1,000,000,000,000,000"):
        model_state(10**15 + 1, 1, 0)
    with pytest.raises(ValueError, match="params"):   # beyond int64: refused, not wrapped round
        model_state(np.uint64(2**63 + 5), 1, 0)


def test_shapes_that_do_not_broadcast_name_the_arguments():
    with pytest.raises(ValueError, match=r"params, gpus, stage must broadcast together.*"
                                         r"params \(3,\), gpus \(2,\), stage \(\)"):
        model_state([1, 2, 3], [1, 2], 0)


def test_layout_parts_must_be_named_widths():
    with pytest.raises(TypeError, match=r"parts\['parameters'\] must be \(\(part name"):
        Layout("bare widths", {"parameters": 2, "gradients": 2, "optimizer": 12})
    with pytest.raises(ValueError, match="categories"):
        Layout("no optimizer", {"parameters": (("p", 2),), "gradients": (("g", 2),)})


def test_unknown_layout():
    with pytest.raises(ValueError, match="layout must be one of mixed-adam"):
        model_state(1000, 4, 0, "adam-16bit")


counts = st.integers(min_value=1, max_value=10**13)
workers = st.integers(min_value=1, max_value=4096)
layouts = st.sampled_from(sorted(LAYOUTS))


@settings(max_examples=200, deadline=None)
@given(counts, workers, layouts)
def test_memory_never_rises_from_one_stage_to_the_next(params, gpus, layout):
    total = model_state(params, gpus, [0, 1, 2, 3], layout).total
    assert np.all(np.diff(total) <= 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=10**9), workers, layouts)
def test_stage3_times_workers_is_stage0(shard, gpus, layout):
    params = shard * gpus  # a count the workers divide evenly
    state = model_state(params, gpus, [0, 3], layout)
    assert state.total[1] * gpus == state.total[0]


@settings(max_examples=200, deadline=None)
@given(counts, workers, layouts)
def test_uneven_stage3_pads_by_less_than_one_element_per_worker(params, gpus, layout):
    state = model_state(params, gpus, [0, 3], layout)
    bytes_per_param = get_layout(layout).total
    assert state.total[0] <= state.total[1] * gpus < state.total[0] + (gpus + 3) * bytes_per_param


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=10**8), st.integers(1, 1000), st.integers(1, 1000),
       st.sampled_from([0, 1, 2, 3]), layouts)
def test_linear_in_params(shard, gpus, factor, stage, layout):
    params = shard * gpus
    once = model_state(params, gpus, stage, layout)
    scaled = model_state(params * factor, gpus, stage, layout)
    for name in ("parameters", "gradients", "optimizer", "total"):
        assert getattr(scaled, name) == factor * getattr(once, name)


@settings(max_examples=200, deadline=None)
@given(counts, layouts)
def test_one_worker_all_stages_equal(params, layout):
    total = model_state(params, 1, [0, 1, 2, 3], layout).total
    assert np.all(total == total[0])


widths = st.integers(min_value=0, max_value=64 * 8).map(lambda bits: bits / 8)


@settings(max_examples=300, deadline=None)
@given(counts, workers, st.sampled_from([0, 1, 2, 3]), widths, widths, widths)
def test_total_is_the_sum_of_the_categories(params, gpus, stage, p, g, o):
    state = model_state(params, gpus, stage, Layout.custom(p, g, o))
    assert state.total == state.parameters + state.gradients + state.optimizer
    # Each category by hand: ceil(elements * bits / 8), elements = ceil(params / gpus) if partitioned.
    shard = -(-params // gpus)
    for name, width, first in (("parameters", p, 3), ("gradients", g, 2), ("optimizer", o, 1)):
        elements = shard if stage >= first else params
        assert getattr(state, name) == -(-(elements * int(width * 8)) // 8)


@settings(max_examples=200, deadline=None)
@given(counts, workers, st.sampled_from([0, 1, 2, 3]), layouts)
def test_cluster_total_is_per_worker_times_workers(params, gpus, stage, layout):
    state = model_state(params, gpus, stage, layout)
    assert state.cluster_total == state.total * gpus
