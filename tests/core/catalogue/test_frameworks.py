"""The frameworks' spellings of the ZeRO stages: what each offers, read from their sources by
hand, and agreeing with the engines zerolib models under the same name."""
from __future__ import annotations

import pytest

import zerolib as zl
from zerolib.core.catalogue.frameworks import FRAMEWORKS, SPELLINGS, offered_stages


# Read from each source (see the module's doc): DeepSpeed's "stage" takes 0-3; FSDP1's
# ShardingStrategy has NO_SHARD, SHARD_GRAD_OP and FULL_SHARD (and hybrids) but nothing that
# shards only the optimizer state; FSDP2 and torchtitan (FSDP2 under the hood) likewise;
# Megatron-LM has its distributed optimizer and Megatron-FSDP's optim_grads / optim_grads_params.
@pytest.mark.parametrize("framework, stages", [
    ("DeepSpeed", (0, 1, 2, 3)), ("PyTorch FSDP1", (0, 2, 3)), ("PyTorch FSDP2", (0, 2, 3)),
    ("Megatron-LM", (0, 1, 2, 3)), ("torchtitan", (0, 2, 3))])
def test_each_framework_offers_the_stages_its_source_has(framework, stages):
    assert offered_stages(framework) == stages


@pytest.mark.parametrize("framework, engine", [("DeepSpeed", "deepspeed"),
                                               ("PyTorch FSDP2", "fsdp2"),
                                               ("Megatron-LM", "megatron")])
def test_every_stage_an_engine_models_has_a_spelling(framework, engine):
    # zerolib's megatron engine is the distributed optimizer only (Megatron-FSDP is not modelled)
    assert set(zl.ENGINES[engine].stages) <= set(offered_stages(framework))


def test_the_table_spells_the_settings_people_type():
    table = zl.framework_table()
    assert list(table.columns) == list(FRAMEWORKS) and list(table.index) == [0, 1, 2, 3]
    assert table.loc[1, "Megatron-LM"] == "--use-distributed-optimizer"
    assert table.loc[1, "PyTorch FSDP2"] == "none"
    assert "reshard_after_forward=False" in table.loc[2, "PyTorch FSDP2"]
    assert "FULL_SHARD" in table.loc[3, "PyTorch FSDP1"]
    assert '"stage": 3' in table.loc[3, "DeepSpeed"]
    assert all(len(row) == len(FRAMEWORKS) for row in SPELLINGS.values())


def test_an_unknown_framework_is_named():
    with pytest.raises(ValueError, match="framework must be one of"):
        offered_stages("jax")
