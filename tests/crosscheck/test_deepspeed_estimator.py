"""zerolib.crosscheck.deepspeed_estimator against DeepSpeed's documented worked examples and hand-worked cases.

Expected values are the numbers printed in DeepSpeed's documentation,
docs/code-docs/source/memory.rst (deepspeedai/DeepSpeed, commit cef03bcd, read 2026), section
"API To Estimate Memory Usage" and "Discussion", or are worked out by hand in the comments.
DeepSpeed prints GiB (2**30 bytes) with the label "GB".
"""
from __future__ import annotations

import numpy as np
import pytest

from zerolib.crosscheck.deepspeed_estimator import (
    ADDITIONAL_BUFFER_FACTOR,
    ZERO2_FORMULAS,
    estimate_zero2,
    estimate_zero3,
    format_gib,
    format_row,
    zero2_table,
    zero3_table,
)

# --- Model sizes of the documented examples, derived by hand from the model configs ------------
#
# t5-3b (AutoModel = T5Model, no LM head, embedding shared by encoder and decoder):
# d_model 1024, d_ff 16384, 24 + 24 layers, 32 heads of d_kv 128 (inner 4096), vocab 32128,
# 32 relative-attention buckets (bias only in the first layer of each stack), RMS norms of 1024.
#   shared embedding  32128 * 1024                                   =    32,899,072
#   encoder layer     4 * 1024 * 4096 + 2 * 1024 * 16384 + 2 * 1024  =    50,333,696  (x 24)
#   decoder layer     8 * 1024 * 4096 + 2 * 1024 * 16384 + 3 * 1024  =    67,111,936  (x 24)
#   extras            2 * (32 * 32 bias + 1024 final norm)            =         4,096
T5_3B_PARAMS = 32_899_072 + 24 * 50_333_696 + 24 * 67_111_936 + 4_096
# Largest single module: the shared embedding (a Linear 1024 x 16384 has only 16.8M).
T5_LARGEST_LAYER = 32_128 * 1_024
# t5-large: d_model 1024, d_ff 4096, 24 + 24 layers, 16 heads of d_kv 64 (inner 1024).
#   encoder layer 4 * 1024**2 + 2 * 1024 * 4096 + 2 * 1024 = 12,584,960
#   decoder layer 8 * 1024**2 + 2 * 1024 * 4096 + 3 * 1024 = 16,780,288
#   extras        2 * (32 * 16 bias + 1024 final norm)      = 3,072
T5_LARGE_PARAMS = 32_899_072 + 24 * 12_584_960 + 24 * 16_780_288 + 3_072


def test_hand_derived_model_sizes_match_what_the_docs_print():
    # memory.rst prints "SW: Model with 2851M total params, 32M largest layer params." for t5-3b
    # and "total params: 737.67M", "largest layer params: 32.90M" for t5-large.
    assert T5_3B_PARAMS == 2_851_598_336
    assert int(T5_3B_PARAMS / 1e6) == 2851 and int(T5_LARGEST_LAYER / 1e6) == 32
    assert f"{T5_LARGE_PARAMS / 1e6:6.2f}M" == "737.67M"
    assert f"{T5_LARGEST_LAYER / 1e6:6.2f}M" == " 32.90M"


# --- ZeRO-2 worked examples (memory.rst, "ZeRO2: Examples") ------------------------------------
# The docs' 15.93 GB is the pre-v0.14.3 formula 4 * P + 16 * P / N; the code since v0.14.3
# (2 * P + 18 * P / N) gives 11.28 / 11.29 GB for the same models.

DOCS_ZERO2_COLD = """\
Estimated memory needed for params, optim states and gradients for a:
HW: Setup with 1 node, 8 GPUs per node.
SW: Model with 2851M total params.
  per CPU  |  per GPU |   Options
  127.45GB |   5.31GB | offload_optimizer=cpu
  127.45GB |  15.93GB | offload_optimizer=none"""

# t5-3b loaded live: the same table, printed with the model's exact parameter count.
DOCS_ZERO2_LIVE_ROWS = [("127.48GB", "5.31GB", "offload_optimizer=cpu"),
                        ("127.48GB", "15.93GB", "offload_optimizer=none")]


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


def test_zero2_cold_example_reproduced_with_the_v0_14_2_formula():
    table = zero2_table(2851e6, num_gpus_per_node=8, num_nodes=1, formula="v0.14.2")
    assert _lines("\n".join(table)) == _lines(DOCS_ZERO2_COLD)


def test_zero2_live_example_reproduced_with_the_v0_14_2_formula():
    for offload, (cpu, gpu, options) in zip((True, False), DOCS_ZERO2_LIVE_ROWS, strict=True):
        estimate = estimate_zero2(T5_3B_PARAMS, 8, 1, cpu_offload=offload, formula="v0.14.2")
        assert format_gib(estimate.per_cpu, 0) == cpu
        assert format_gib(estimate.per_gpu, 0) == gpu
        assert estimate.options.rstrip() == options


def test_zero2_current_formula_differs_from_the_docs_only_without_offload():
    old = estimate_zero2(2851e6, 8, 1, cpu_offload=False, formula="v0.14.2")
    new = estimate_zero2(2851e6, 8, 1, cpu_offload=False)
    # By hand: 2 * 2851e6 + 18 * 2851e6 / 8 = 5,702,000,000 + 6,414,750,000 bytes.
    assert new.per_gpu == 12_116_750_000
    assert format_gib(new.per_gpu, 0) == "11.28GB"
    # 4 * 2851e6 + 16 * 2851e6 / 8 = 11,404,000,000 + 5,702,000,000 bytes.
    assert old.per_gpu == 17_106_000_000
    assert new.per_cpu == old.per_cpu
    for formula in ZERO2_FORMULAS:  # offloaded: only fp16 params on the GPU in both
        assert estimate_zero2(2851e6, 8, 1, formula=formula).per_gpu == 2 * 2_851_000_000


# --- ZeRO-3 worked examples (memory.rst, "ZeRO3: Examples") ------------------------------------

DOCS_ZERO3_COLD = """\
Estimated memory needed for params, optim states and gradients for a:
HW: Setup with 1 node, 8 GPUs per node.
SW: Model with 2851M total params, 32M largest layer params.
  per CPU  |  per GPU |   Options
   71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
  127.45GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
   63.72GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=1
  127.45GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=0
    1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1
  127.45GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=0"""

DOCS_ZERO3_LIVE = """\
Estimated memory needed for params, optim states and gradients for a:
HW: Setup with 1 node, 8 GPUs per node.
SW: Model with 2851M total params, 32M largest layer params.
  per CPU  |  per GPU |   Options
   71.71GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
  127.48GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
   63.74GB |   0.79GB | offload_param=none, offload_optimizer=cpu , zero_init=1
  127.48GB |   0.79GB | offload_param=none, offload_optimizer=cpu , zero_init=0
    1.47GB |   6.10GB | offload_param=none, offload_optimizer=none, zero_init=1
  127.48GB |   6.10GB | offload_param=none, offload_optimizer=none, zero_init=0"""


def test_zero3_cold_example_reproduced():
    table = zero3_table(2851e6, 32e6, num_gpus_per_node=8, num_nodes=1)
    assert _lines("\n".join(table)) == _lines(DOCS_ZERO3_COLD)


def test_zero3_live_example_reproduced_from_the_t5_3b_config():
    table = zero3_table(T5_3B_PARAMS, T5_LARGEST_LAYER, num_gpus_per_node=8, num_nodes=1)
    assert _lines("\n".join(table)) == _lines(DOCS_ZERO3_LIVE)


def test_zero3_discussion_example_t5_large_on_4_gpus():
    # memory.rst "Discussion", GPU RAM: prints bytes >> 20 (MiB labelled "MB") for total_gpus=4:
    # largest layer memory 125MB, case1 3291MB, case2 125MB, case3 477MB.
    case1 = estimate_zero3(T5_LARGE_PARAMS, T5_LARGEST_LAYER, 4, 1, cpu_offload=False,
                           cpu_offload_params=False)
    case2 = estimate_zero3(T5_LARGE_PARAMS, T5_LARGEST_LAYER, 4, 1, cpu_offload=True,
                           cpu_offload_params=True)
    case3 = estimate_zero3(T5_LARGE_PARAMS, T5_LARGEST_LAYER, 4, 1, cpu_offload=True,
                           cpu_offload_params=False)
    assert case1.largest_layer >> 20 == 125
    assert (case1.per_gpu >> 20, case2.per_gpu >> 20, case3.per_gpu >> 20) == (3291, 125, 477)


# --- Hand-worked checks ------------------------------------------------------------------------

def test_zero2_hand_worked_bytes():
    # P = 1000 on 4 GPUs of one node, factor 1.5.
    no_offload = estimate_zero2(1000, 4, 1, cpu_offload=False)
    assert no_offload.per_gpu == 2 * 1000 + 18 * 1000 // 4 == 6500
    assert no_offload.per_cpu == 1000 * 4 * 4 * 1.5 == 24_000
    assert estimate_zero2(1000, 4, 1, cpu_offload=False, formula="v0.14.2").per_gpu == 8000
    offload = estimate_zero2(1000, 4, 1, cpu_offload=True)
    assert (offload.per_gpu, offload.per_cpu) == (2000, 24_000)  # max(4 * 4, 16) = 16
    # On 8 GPUs the 4 * total_gpus term wins: 1000 * 32 * 1.5.
    assert estimate_zero2(1000, 8, 1).per_cpu == 48_000
    # Two nodes of 4: total_gpus = 8 for both the GPU share and the offload term.
    assert estimate_zero2(1000, 4, 2).per_cpu == 48_000
    assert estimate_zero2(1000, 4, 2, cpu_offload=False).per_gpu == 2000 + 18_000 // 8
    assert estimate_zero2(1000, 4, 2, cpu_offload=False).per_cpu == 24_000  # per node


def test_zero2_truncates_like_int():
    # P = 7 on 4 GPUs: 14 + int(126 / 4 = 31.5) = 45; CPU int(7 * 4 * 4 * 1.1 = 123.2) = 123.
    estimate = estimate_zero2(7, 4, 1, cpu_offload=False, additional_buffer_factor=1.1)
    assert estimate.per_gpu == 45
    assert estimate.per_cpu == 123
    assert isinstance(estimate.per_gpu, int) and isinstance(estimate.per_cpu, int)


def test_zero3_hand_worked_bytes_two_nodes():
    # P = 1000, largest layer 100, 2 nodes of 4 GPUs: total_gpus 8, gpus_factor 1/2.
    def run(offload, offload_params, init):
        e = estimate_zero3(1000, 100, 4, 2, offload, offload_params, init)
        return e.per_cpu, e.per_gpu, e.largest_layer

    assert run(True, True, True) == (1000 * 18 // 2 * 3 // 2, 400, 400)     # 13500
    assert run(True, True, False) == (1000 * 16 * 3 // 2, 400, 400)         # max(16, 9) = 16
    assert run(True, False, True) == (1000 * 8 * 3 // 2, 400 + 250, 400)    # 16 / 2 = 8
    assert run(True, False, False) == (1000 * 16 * 3 // 2, 650, 400)        # max(16, 8)
    assert run(False, False, True) == (100 * 4 * 4 * 3 // 2, 400 + 2250, 400)
    assert run(False, False, False) == (1000 * 4 * 4 * 3 // 2, 2650, 400)
    # DeepSpeed ignores offload_param when the optimizer stays on the GPU.
    assert run(False, True, True) == run(False, False, True)


def test_additional_buffer_factor_scales_only_the_cpu_side():
    base = estimate_zero3(10**9, 10**7, 8, 1, cpu_offload=False, cpu_offload_params=False)
    tight = estimate_zero3(10**9, 10**7, 8, 1, cpu_offload=False, cpu_offload_params=False,
                           additional_buffer_factor=1.0)
    assert ADDITIONAL_BUFFER_FACTOR == 1.5
    assert base.per_gpu == tight.per_gpu == 4 * 10**7 + 18 * 10**9 // 8
    assert base.per_cpu == 10**7 * 4 * 8 * 3 // 2 and tight.per_cpu == 10**7 * 4 * 8


def test_arrays_broadcast_and_match_scalars():
    params = np.array([10**6, 7 * 10**9, 175 * 10**9])
    gpus = np.array([[1], [8], [64]])
    batch = estimate_zero2(params, gpus, 1, cpu_offload=False)
    assert batch.per_gpu.shape == (3, 3) and batch.per_gpu.dtype == np.int64
    for i, g in enumerate(gpus[:, 0]):
        for j, p in enumerate(params):
            scalar = estimate_zero2(int(p), int(g), 1, cpu_offload=False)
            assert (batch.per_gpu[i, j], batch.per_cpu[i, j]) == (scalar.per_gpu, scalar.per_cpu)


def test_format_gib_labels_gib_as_gb():
    assert format_gib(2**30) == "  1.00GB"
    assert format_gib(10**9) == "  0.93GB"  # one decimal GB is 0.93 GiB
    assert format_row(3 * 2**29, 2**30, "x") == "    1.50GB |   1.00GB | x"


# --- Bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, word", [
    ({"total_params": 0}, ValueError, "total_params"),
    ({"total_params": -5}, ValueError, "total_params"),
    ({"total_params": 1.5}, ValueError, "total_params"),
    ({"total_params": "7B"}, TypeError, "total_params"),
    ({"total_params": True}, TypeError, "total_params"),
    ({"total_params": float("nan")}, ValueError, "total_params"),
    ({"total_params": 10, "num_gpus_per_node": 0}, ValueError, "num_gpus_per_node"),
    ({"total_params": 10, "num_nodes": 2.5}, ValueError, "num_nodes"),
    ({"total_params": 10, "cpu_offload": 1}, TypeError, "cpu_offload"),
    ({"total_params": 10, "additional_buffer_factor": 0}, ValueError, "additional_buffer_factor"),
    ({"total_params": 10, "additional_buffer_factor": "1.5"}, TypeError,
     "additional_buffer_factor"),
    ({"total_params": 10, "formula": "0.19"}, ValueError, "formula"),
])
def test_zero2_rejects_bad_input(kwargs, error, word):
    with pytest.raises(error, match=word):
        estimate_zero2(**kwargs)


@pytest.mark.parametrize("kwargs, error, word", [
    ({"largest_layer_params": 0}, ValueError, "largest_layer_params"),
    ({"largest_layer_params": 2000}, ValueError, "largest_layer_params"),
    ({"zero_init": "yes"}, TypeError, "zero_init"),
    ({"cpu_offload_params": None}, TypeError, "cpu_offload_params"),
    ({"additional_buffer_factor": float("inf")}, ValueError, "additional_buffer_factor"),
])
def test_zero3_rejects_bad_input(kwargs, error, word):
    arguments = {"total_params": 1000, "largest_layer_params": 10, **kwargs}
    with pytest.raises(error, match=word):
        estimate_zero3(**arguments)


def test_shapes_that_do_not_broadcast_name_the_arguments():
    with pytest.raises(ValueError, match="total_params, num_gpus_per_node, num_nodes"):
        estimate_zero2([10**9, 2 * 10**9], [1, 2, 4])


def test_tables_want_single_numbers():
    with pytest.raises(TypeError, match="total_params"):
        zero2_table([10**9, 2 * 10**9], 8)
    with pytest.raises(TypeError, match="n_bytes"):
        format_gib("1")
    with pytest.raises(TypeError, match="width"):
        format_gib(2**30, 6.0)
    with pytest.raises(ValueError, match="width"):
        format_gib(2**30, -1)


# --- The chapter's convention turned into DeepSpeed's, term by term ---------------------------

def test_convention_gap_t5_3b_on_8_gpus_by_hand():
    from zerolib.crosscheck.deepspeed_estimator import (
        GAP_COLUMNS,
        GAP_TERMS,
        convention_gap,
    )

    gap = convention_gap(2851e6, 32e6, num_gpus_per_node=8)
    assert tuple(gap.columns) == GAP_COLUMNS and tuple(gap.index) == GAP_TERMS
    zero2, old, zero3 = (gap[c] for c in GAP_COLUMNS)
    # P = 2,851,000,000 on 8 GPUs: P/8 = 356,375,000 exactly.
    # Chapter stage 2: 2P + 14 P/8 = 5,702,000,000 + 4,989,250,000; stage 3: 16 P/8.
    assert zero2.iloc[0] == old.iloc[0] == 10_691_250_000
    assert zero3.iloc[0] == 5_702_000_000
    # + 4 B x P/8 = 1,425,500,000 of fp32 gradient shard: DeepSpeed's 2P + 18P/8.
    assert zero2.iloc[2] == zero3.iloc[2] == old.iloc[2] == 1_425_500_000
    assert zero2.iloc[-1] == 12_116_750_000
    # Up to v0.14.2: + 2 B x (P - P/8) = 4,989,250,000 -> 4P + 16P/8 = 17,106,000,000 (15.93 GiB).
    assert old.iloc[1] == 4_989_250_000 and old.iloc[-1] == 17_106_000_000
    assert format_gib(old.iloc[-1], 0) == "15.93GB"
    # ZeRO-3: - 2 B x P/8 + 4 B x 32e6 -> 128e6 + 18P/8 = 6,542,750,000 (6.09 GiB).
    assert (zero3.iloc[3], zero3.iloc[4], zero3.iloc[-1]) == (-712_750_000, 128_000_000,
                                                             6_542_750_000)
    assert (gap.iloc[5] == 0).all()  # 8 divides 2851e6: no rounding
    assert (gap.iloc[:-1].sum() == gap.iloc[-1]).all()


def test_convention_gap_rounding_row_when_gpus_do_not_divide():
    from zerolib.crosscheck.deepspeed_estimator import convention_gap

    # P = 1,838,337 on 4 GPUs: the chapter counts ceil(P/4) = 459,585 per partitioned
    # category, 14 B x 459,585 = 6,434,190; DeepSpeed int(18P/4) = 8,272,516; the fp32 term
    # uses P // 4 = 459,584: 6,434,190 + 1,838,336 - 8,272,516 = 10 B the chapter has more.
    gap = convention_gap(1_838_337, 1_049_600, num_gpus_per_node=4)
    assert gap.iloc[-1, 0] == 2 * 1_838_337 + 8_272_516
    assert gap.iloc[5, 0] == -10
    assert (gap.iloc[:-1].sum() == gap.iloc[-1]).all()


def test_convention_gap_rejects_bad_input():
    from zerolib.crosscheck.deepspeed_estimator import convention_gap

    with pytest.raises(ValueError, match="largest_layer_params"):
        convention_gap(1000, 2000)
    with pytest.raises(TypeError, match="total_params"):
        convention_gap(np.array([10**9, 2 * 10**9]), 10**6)
    with pytest.raises(ValueError, match="num_gpus_per_node"):
        convention_gap(10**9, 10**6, num_gpus_per_node=0)


def test_buffer_defaults_are_deepspeeds_and_scale_with_the_element_size():
    from zerolib.crosscheck.deepspeed_estimator import (
        REDUCE_BUCKET_SIZE,
        buffer_defaults,
    )

    # deepspeed/runtime/zero/config.py (v0.19.8): reduce_bucket_size = 5e8 elements.
    assert REDUCE_BUCKET_SIZE == 500_000_000
    bf16 = buffer_defaults(2).set_index("config key")
    fp32 = buffer_defaults(4).set_index("config key")
    assert bf16.at["reduce_bucket_size", "at 2 B per element [B]"] == 1_000_000_000
    assert fp32.at["reduce_bucket_size", "at 4 B per element [B]"] == 2_000_000_000
    assert bf16.at["stage3_param_persistence_threshold", "default [elements]"] == 100_000
    assert bf16.at["stage3_max_live_parameters", "default [elements]"] == 10**9
    for bad in (3, True, "2"):
        with pytest.raises(ValueError, match="element_bytes"):
            buffer_defaults(bad)
