"""Expert parallelism's model state per GPU, against counts worked out by hand.

Mixtral-8x7B (config.json: hidden 4096, 32 layers, 32 heads, 8 key/value heads, ffn 14336,
vocab 32000, untied, 8 experts): one expert of one layer is 3 x 4096 x 14336 = 176,160,768
parameters; the dense part (attention 41,943,040 + norms 8,192 + router 32,768 per layer,
x 32, plus 2 x 32000 x 4096 embeddings and a 4,096 final norm) is 1,605,636,096; the total is
the published 46,702,792,704.
"""
from __future__ import annotations

import pytest

from zerolib.core.catalogue.models import parameter_count
from zerolib.core.memory.expert_parallel import (
    check_expert_layout,
    expert_model_state,
    stage_parameters,
)
from zerolib.core.memory.model_parallel import model_state_per_gpu

EXPERT = 3 * 4096 * 14336
DENSE = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 4096 + 4096 * 8) + 2 * 32000 * 4096 + 4096


def test_hand_count_of_mixtral_is_the_published_total():
    assert DENSE == 1_605_636_096
    assert DENSE + 32 * 8 * EXPERT == 46_702_792_704 == parameter_count("mixtral-8x7b")


def test_eight_way_expert_parallelism_holds_one_expert_per_layer():
    lay = check_expert_layout("mixtral-8x7b", 1, 1, 8, 8)
    params = stage_parameters("mixtral-8x7b", lay, 0)
    assert (params.dense, params.experts, params.expert_layers) == (DENSE, 32 * EXPERT, 32)
    assert lay.expert_data_parallel == 1


def test_zero1_dense_over_d_experts_over_the_expert_data_parallel_group():
    state = expert_model_state("mixtral-8x7b", 1, 1, 8, 1, expert_parallel=8)
    # dense: 2 + 2 bytes whole, 12 bytes over 8; experts: EDP = 8 / 8 = 1, all 16 bytes whole
    dense = 4 * DENSE + 12 * (DENSE // 8)
    experts = 16 * 32 * EXPERT
    assert state.dense["total"] == dense == 8_830_998_528
    assert state.experts["total"] == experts == 90_194_313_216
    assert state.total == 99_025_311_744


def test_expert_data_parallel_group_of_two_halves_the_expert_optimizer():
    state = expert_model_state("mixtral-8x7b", 1, 1, 16, 1, expert_parallel=8)
    assert state.layout.expert_data_parallel == 2
    assert state.experts["optimizer"] == 12 * 32 * EXPERT // 2
    assert state.dense["optimizer"] == 12 * (DENSE // 16)


def test_no_expert_parallelism_is_the_tensor_pipeline_count():
    for t, p, d, stage in [(1, 1, 8, 3), (2, 4, 2, 1), (8, 2, 4, 0)]:
        ours = expert_model_state("mixtral-8x7b", t, p, d, stage)
        theirs = model_state_per_gpu("mixtral-8x7b", t, p, d, stage)
        assert ours.total == int(theirs.total)


def test_expert_tensor_parallel_one_under_tensor_parallel_two():
    # t = 2, ETP = 1, E = 4 on d = 4: experts whole, 8 / 4 = 2 per layer; EDP = 2 x 4 / 4 = 2
    lay = check_expert_layout("mixtral-8x7b", 2, 1, 4, 4, 1)
    assert lay.expert_data_parallel == 2
    assert stage_parameters("mixtral-8x7b", lay, 0).experts == 32 * 2 * EXPERT


def test_pipeline_stage_with_dense_first_layers_counts_only_its_expert_layers():
    # DeepSeek-V2-Lite style: the first layer dense; p = 3 over 27 layers: stage 0 has 9 layers,
    # 1 dense and 8 with experts
    from conftest import REPO

    from zerolib.core.catalogue.hf_config import model_from_config
    config = model_from_config(REPO / "tests" / "data" / "deepseek-v2-lite.json")
    lay = check_expert_layout(config, 1, 3, 2, 2)
    assert stage_parameters(config, lay, 0).expert_layers == 8
    assert stage_parameters(config, lay, 1).expert_layers == 9


@pytest.mark.parametrize("args, words", [
    ((1, 1, 8, 3), "expert_parallel must divide the routed experts"),
    ((1, 1, 2, 4), "expert_tensor_parallel x expert_parallel must divide tensor_parallel x data_parallel"),
])
def test_rules(args, words):
    with pytest.raises(ValueError, match=words):
        check_expert_layout("mixtral-8x7b", *args)


def test_dense_model_refuses_expert_parallelism():
    with pytest.raises(ValueError, match="need a mixture of experts"):
        check_expert_layout("llama-2-7b", 1, 1, 8, 2)


def test_bad_type_names_the_argument():
    with pytest.raises((TypeError, ValueError), match="expert_parallel"):
        check_expert_layout("mixtral-8x7b", 1, 1, 8, 2.5)


def test_degrees_a_search_enumerates():
    from zerolib.core.memory.expert_parallel import expert_parallel_degrees
    # Mixtral's 8 experts: E divides 8 and t x d / ETP
    assert expert_parallel_degrees("mixtral-8x7b", 1, 8) == (1, 2, 4, 8)
    assert expert_parallel_degrees("mixtral-8x7b", 1, 6) == (1, 2)
    assert expert_parallel_degrees("mixtral-8x7b", 2, 2, 1) == (1, 2, 4)
    assert expert_parallel_degrees("llama-2-7b", 1, 8) == (1,)
