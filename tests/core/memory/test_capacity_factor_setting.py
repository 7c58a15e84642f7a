"""The capacity factor as a stated setting of the working set: checked once when the settings
are made, said in as_dict, and carried to every activation path (whole model, pipeline stage)."""
from __future__ import annotations

import pytest
from conftest import REPO

from zerolib.core.catalogue.hf_config import model_from_config
from zerolib.core.memory.working_set import WorkingSetSettings, working_set

MIXTRAL = model_from_config(REPO / "tests" / "data" / "mixtral-8x7b-v0.1.json")
H, F, E, K, L = 4096, 14336, 8, 2, 32     # Mixtral-8x7B's config.json


def _extra_per_layer(seq_len: int, factor: float) -> int:
    """Bytes one layer saves beyond dropless routing: the experts hold E x ceil(c k s b / E)
    token slots instead of k s b; the expert input and output (h wide) and the gated MLP's four
    f-wide tensors grow with them, 2 bytes an element."""
    dropless = K * seq_len
    slots = E * -(-int(factor * 4 * K * seq_len) // (4 * E))     # ceil(c k s / E), c in quarters
    grown = slots - dropless
    return 2 * 2 * grown * H + 4 * 2 * grown * F


def test_mixtral_slots_by_hand():
    # c = 1.25, k = 2, s = 4,096: ceil(1.25 x 8,192 / 8) = 1,280 slots per expert, 10,240 in all.
    assert _extra_per_layer(4096, 1.25) == 2 * 2 * 2048 * H + 4 * 2 * 2048 * F


def test_settings_carry_the_capacity_factor_to_the_activations():
    dropless = WorkingSetSettings(seq_len=4096)
    padded = WorkingSetSettings(seq_len=4096, capacity_factor=1.25)
    assert dropless.as_dict()["capacity_factor"] is None
    assert padded.as_dict()["capacity_factor"] == 1.25
    grown = working_set(MIXTRAL, 1, padded)["activations"] - working_set(MIXTRAL, 1, dropless)["activations"]
    assert grown == L * _extra_per_layer(4096, 1.25)


def test_pipeline_stages_carry_it_too():
    # p = 2, 1F1B: stage 0 holds 2 micro-batches of 16 layers, stage 1 one of 16.
    for r, copies in ((0, 32), (1, 16)):
        ws = {cf: working_set(MIXTRAL, 1, WorkingSetSettings(seq_len=4096, pipeline_parallel=2,
                                                              capacity_factor=cf), pipeline_stage=r)
              for cf in (None, 1.25)}
        assert ws[1.25]["activations"] - ws[None]["activations"] == copies * _extra_per_layer(4096, 1.25)


@pytest.mark.parametrize("bad", [0.5, 65, True, "1.25", float("nan")])
def test_a_bad_capacity_factor_is_refused_when_the_settings_are_made(bad):
    with pytest.raises(ValueError, match="capacity_factor must be a number from 1 to 64"):
        WorkingSetSettings(capacity_factor=bad)


def test_an_integer_factor_is_kept_as_a_number():
    assert WorkingSetSettings(capacity_factor=2).capacity_factor == 2.0
