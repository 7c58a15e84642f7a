"""Each MoE layer's tensor-parallel collectives as Megatron-LM's alltoall dispatcher runs them.

Hand-worked (Megatron-LM d98e8a64, megatron/core/transformer/moe/token_dispatcher.py: the
dispatcher's group is expt_tp, line 86; all-gather over it before the experts, lines 746-751;
reduce-scatter after, line 829). Tiny MoE: h 16, 4 experts, top-2, 2 layers, s 8, b 1, t 2 with
sequence parallelism, E 2: R = 8 / 2 tokens x 2 = 8 rows of 32 B = 256 B. Per MoE layer 4 calls
over ETP of an ETP x R tensor, (ETP - 1) x R sent: ETP 2: 8 x 256 = 2,048 B; ETP 4: 8 x 768 = 6,144 B.
Not yet counted at ETP = t (zerolib counts the dense MLP's t-collectives there instead).
"""
from __future__ import annotations

import pytest

from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.step.expert_parallel_traffic import expert_traffic

TINY = TransformerConfig("tiny-moe", hidden=16, layers=2, heads=2, kv_heads=2, ffn_hidden=32,
                         vocab=64, max_positions=64, tied_embeddings=False, gated_mlp=True,
                         experts=4, experts_per_token=2)


@pytest.mark.parametrize("etp, sent", [
    (2, 2048),
    (4, 6144)])
def test_dispatcher_etp_collectives_per_step(etp, sent):
    traffic = expert_traffic(TINY, 8, 1, 2, tensor_parallel=2, sequence_parallel=True,
                             expert_tensor_parallel=etp)
    assert traffic.step_etp_sent_bytes == sent
