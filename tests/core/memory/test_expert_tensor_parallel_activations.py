"""The experts' activations under expert tensor parallelism (ETP) other than t, by hand.

A small mixture of experts: hidden 16, 2 heads, ffn 32 (gated), 4 experts, top-2, 2 layers.
Sequence 8, micro-batch 1, t = 2 with sequence parallelism, dropless: 8 x 2 = 16 token slots.
Megatron-LM's alltoall dispatcher (token_dispatcher.py at d98e8a64): a rank routes its 8 / 2 = 4
tokens, 8 rows; under uniform routing it receives 8 rows back from the all-to-all and all-gathers
them over its ETP ranks, so the experts' first projections save ETP x 8 rows of 16 elements:
  ETP = 1: 8 rows  x 16 x 2 B = 256 B;  ETP = 4: 32 rows x 16 x 2 B = 1,024 B.
ETP = t = 2 (and None, which means t) gathers over its 2 ranks as well (dispatch_postprocess:
gather_from_sequence_parallel_region(..., group=self.tp_group), tp_group = expt_tp):
  16 rows x 16 x 2 B = 512 B (it was slots x h / t = 256 B, the same as ETP = 1: an under-count).
Megatron-LM's default allgather dispatcher gathers the 4 tokens of each of the ETP x EP ranks and
keeps the rows routed to its own experts: under uniform routing the same ETP x 8 rows.
The f-wide tensors are ETP x 8 rows by 32 / ETP: 8 x 32 x 2 B = 512 B each, for every ETP.
"""
from __future__ import annotations

import pytest

from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.memory.activations import (
    ActivationOptions,
    layer_activation_terms,
    layer_shape,
    model_activation_terms,
)
from zerolib.core.memory.pipeline_schedule import unit_terms

TINY = TransformerConfig("tiny-moe", hidden=16, layers=2, heads=2, kv_heads=2, ffn_hidden=32,
                         vocab=64, max_positions=64, tied_embeddings=False, gated_mlp=True,
                         experts=4, experts_per_token=2)
SHAPE = dict(ffn_hidden=32, gated_mlp=True, experts=4, experts_per_token=2)


def _layer(etp, sequence_parallel=True, **shape):
    return layer_activation_terms(layer_shape(16, 2, **{**SHAPE, **shape}), 8, 1, 2,
                                  ActivationOptions(sequence_parallel=sequence_parallel,
                                                    expert_tensor_parallel=etp))


@pytest.mark.parametrize("etp, expert_input", [(None, 512), (2, 512), (1, 256), (4, 1024)])
def test_expert_input_is_the_gathered_rows(etp, expert_input):
    terms = _layer(etp)
    assert terms["expert_input"] == expert_input
    assert terms["expert_output"] == 256                # the reduce-scattered 8 rows of 16
    for name in ("mlp_gate_projection", "mlp_activation_output", "mlp_up_projection",
                 "mlp_down_projection_input"):
        assert terms[name] == 8 * 32 * 2                # ETP x 8 rows by 32 / ETP


def test_only_expert_input_changes():
    base, wide = _layer(None), _layer(4)
    assert {k for k in base if base[k] != wide[k]} == {"expert_input"}
    assert sum(wide.values()) - sum(base.values()) == 1024 - 512


def test_at_t_1_the_gather_is_etp_times_the_rows():
    # t = 1: the rank routes all 8 tokens, 16 rows; ETP = 2 gathers 32 rows of 16 x 2 B
    terms = layer_activation_terms(layer_shape(16, 2, **SHAPE), 8, 1,
                                   options=ActivationOptions(expert_tensor_parallel=2))
    assert terms["expert_input"] == 32 * 16 * 2


def test_etp_equal_to_t_is_no_longer_etp_1():
    # the under-count fixed: ETP = 1 gathers nothing (8 rows), ETP = t = 2 gathers 16 rows
    assert _layer(2)["expert_input"] - _layer(1)["expert_input"] == (16 - 8) * 16 * 2


def test_without_sequence_parallelism_a_rank_holds_every_row():
    # t = 2 without sequence parallelism (ETP = t): each rank routes all 8 tokens, 16 rows,
    # nothing to gather: 16 x 16 x 2 B, as before
    terms = layer_activation_terms(layer_shape(16, 2, **SHAPE), 8, 1, 2)
    assert terms["expert_input"] == 16 * 16 * 2


def test_the_model_and_the_schedule_carry_it():
    model = model_activation_terms(TINY, 8, 1, 2, ActivationOptions(sequence_parallel=True,
                                                                    expert_tensor_parallel=4))
    plain = model_activation_terms(TINY, 8, 1, 2, ActivationOptions(sequence_parallel=True))
    assert model["transformer_layers"] - plain["transformer_layers"] == 2 * (1024 - 512)
    options = ActivationOptions(True, "none", False, 2, 1, None, None, None, 4)
    one = unit_terms(TINY, 8, 1, 2, options)["transformer_layers"]
    assert one - unit_terms(TINY, 8, 1, 2, ActivationOptions(True, "none", False, 2, 1, None, None,
                                                             None))["transformer_layers"] == 512
    # a dense setting's key is what it was
    assert ActivationOptions(True, "none", False, 2, 1, None, None, None) == ActivationOptions(
        True, "none", False, 2, 1, None, None, None, None)


@pytest.mark.parametrize("changes, message", [
    (dict(experts=0, experts_per_token=0), "needs a mixture of experts, got 4"),
    (dict(ffn_hidden=36), r"must divide ffn_hidden \(each expert's width, 36\), got 5"),
    (dict(sequence_parallel=False), "needs sequence_parallel where tensor_parallel is above 1"),
])
def test_refusals_name_the_rule(changes, message):
    etp = 5 if "ffn_hidden" in changes else 4
    with pytest.raises(ValueError, match=message):
        _layer(etp, **changes)
