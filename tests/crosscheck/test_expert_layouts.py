"""Published MoE layouts judged with expert parallelism, against counts by hand.

DeepSeek-V3 (arXiv 2412.19437 Sec. 3.2): PP 16, EP 64, ZeRO-1 over d = 2048 / 16 = 128, so the
experts' group is 128 / 64 = 2. Its first stage holds 4 of the 61 layers (61 = 16 x 3 + 13): the
3 dense ones and 1 with experts. Dense part there, from config.json: embedding 129,280 x 7,168 =
926,679,040; latent attention per layer 7168x1536 + 1536 + 1536x(128x192) + 7168x576 + 512 +
512x(128x256) + (128x128)x7168 = 187,107,328; norms 14,336; the dense MLP 3 x 7168 x 18432 =
396,361,728; the MoE layer's router 7168 x 256 and shared expert 3 x 7168 x 2048. Experts: 256 / 64
= 4 per layer of 3 x 7168 x 2048 = 44,040,192 each.
"""
from __future__ import annotations

from zerolib.core.catalogue.models import parameter_count
from zerolib.crosscheck.expert_layouts import judge, layouts

ATTENTION = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
DENSE_STAGE0 = (129_280 * 7168 + 3 * (ATTENTION + 14_336 + 3 * 7168 * 18432)
                + ATTENTION + 14_336 + 7168 * 256 + 3 * 7168 * 2048)
EXPERTS_STAGE0 = 4 * 3 * 7168 * 2048


def _by_name():
    return {layout.name: layout for layout in layouts()}


def test_deepseek_v3_first_stage_by_hand():
    assert ATTENTION == 187_107_328 and DENSE_STAGE0 == 2_910_126_080
    layout = _by_name()["deepseek-v3"]
    assert parameter_count(layout.model) == 671_026_404_352
    got = judge(layout)
    assert (got["data_parallel"], got["expert_data_parallel"]) == (128, 2)
    # BF16 weights 2 + FP32 gradients 4 whole; 8 B of FP32 master + BF16 moments over the group
    dense = 6 * DENSE_STAGE0 + 8 * (DENSE_STAGE0 // 128)
    experts = 6 * EXPERTS_STAGE0 + 8 * (EXPERTS_STAGE0 // 2)
    assert got["model_state_with_ep"] == dense + experts == 19_404_247_040
    assert got["peak_pipeline_stage"] == 0
    assert got["fits"] is True and got["peak"] < 80 * 2**30


def test_deepseek_v3_without_expert_parallelism_does_not_hold_its_model_state():
    got = judge(_by_name()["deepseek-v3"])
    assert got["model_state_without_ep"] > 3 * 80 * 2**30


def test_mixtral_megatron_core_layout():
    got = judge(_by_name()["mixtral-8x7b-megatron-core"])
    assert (got["data_parallel"], got["expert_data_parallel"]) == (16, 2)
    # the last of 4 stages: 8 layers, one expert per layer of 176,160,768 parameters, 2 + 4 B
    # whole and 12 B over 2; the dense part of 8 layers + final norm + output layer over 16
    dense = 8 * (41_943_040 + 8192 + 32_768) + 4096 + 32000 * 4096
    experts = 8 * 176_160_768
    assert got["model_state_with_ep"] == 6 * dense + 12 * (dense // 16) + 6 * experts + 12 * (experts // 2)
    assert got["fits"] is True


def test_spreading_the_experts_moves_the_peak_to_the_embedding_stage():
    # Without expert parallelism the first stage's 4 layers hold fewer experts than stage 1's
    # 4 MoE layers, so stage 1 decides; spread 64 ways, the embedding on stage 0 decides.
    from zerolib.core.estimate import estimate_model
    from zerolib.core.memory.working_set import WorkingSetSettings, working_set
    from zerolib.crosscheck.expert_layouts import DEEPSEEK_V3_LAYOUT
    layout = _by_name()["deepseek-v3"]
    settings = WorkingSetSettings(seq_len=4096, pipeline_parallel=16, recompute="full")
    plain = estimate_model(layout.model, 2048, settings, DEEPSEEK_V3_LAYOUT, stages=(1,)).as_dict()
    assert plain["stages"][0]["pipeline_stage"] == 1
    got = judge(layout)
    terms = working_set(layout.model, 1, settings, DEEPSEEK_V3_LAYOUT, pipeline_stage=0)
    assert got["peak"] == 19_404_247_040 + sum(terms.values())
