"""The price of ZeRO as tables: zerolib.core.step.tables (the traffic, timeline and
memory-vs-step-time frames).

Worked out by hand for the chapter's setting: Llama-2-7B (P = 6,738,415,616 parameters, layers
that all divide by 64) on 64 H100 80GB in DGX H100 nodes (NVLink 4 inside at 450 GB/s, 8 NDR
ports of 50 GB/s per node: 400 GB/s across), 4,096 tokens per GPU, 40 % of 989.5 TFLOP/s,
mixed-precision Adam (16-bit parameters and gradients).
- Compute: 6 FLOPs per multiplied parameter (P less the 32,000 x 4,096 input embedding, a
  lookup: 6,607,343,616) and 3 x the causal attention core (32 layers x 4,096 x 32 heads x 256
  = 2^30 per token), x 4096 / (0.4 x 989.5e12) = 0.443598 s; forward (2 M + 2^30) x 4096 /
  (0.4 x 989.5e12) = 0.147866 s.
- One ring pass: 63 x P/64 x 2 bytes = 13,266,255,744 bytes per GPU: 0.0331656 s at 400 GB/s.
- Ring latency over 8 nodes: all-gather or reduce-scatter 8.4 + 56 x 3.4 + 7 x 14.0 = 296.8 us,
  all-reduce 8.4 + 112 x 3.4 + 14 x 14.0 = 585.2 us.
- Stage 0: an all-reduce of two passes, 0.0669165 s, hidden in the 0.278934 s backward.
- Stages 1-2: reduce-scatter hidden; the all-gather after the step (0.0334624 s) is not:
  step 0.477061 s, 7.0 % waiting.
- Stage 3: 35 layers (embedding, 32 blocks, final norm, output projection) gathered per pass:
  forward 0.0331656 + 35 x 296.8e-6 = 0.0435536 s, hidden in 0.147866 s; backward twice that,
  hidden in 0.295732 s: step 0.443598 s.
- Peaks (zerolib estimate --model llama-2-7b --gpus 64, flash attention, no recomputation):
  144.44, 52.37, 39.10 and 27.84 GB.
"""

import numpy as np
import pytest

from zerolib.core.catalogue.nodes import interconnect
from zerolib.core.step.tables import timeline_frame, tradeoff_frame, traffic_frame
from zerolib.core.step.time import ComputeSettings

M7 = 6_738_415_616 - 32_000 * 4096
COMPUTE = (6 * M7 + 3 * 2**30) * 4096 / (0.4 * 989.5e12)
FORWARD = (2 * M7 + 2**30) * 4096 / (0.4 * 989.5e12)
PASS = 13_266_255_744
GATHER = PASS / 400e9 + 296.8e-6
STEPS = [COMPUTE, COMPUTE + GATHER, COMPUTE + GATHER, COMPUTE]
PEAKS_GB = [144.44, 52.37, 39.10, 27.84]
# The ring arithmetic above is at the links' line rates.
LINE_RATE_DGX_H100 = interconnect("dgx-h100", efficiency="line-rate")


@pytest.fixture(scope="module")
def timeline():
    return timeline_frame("llama-2-7b", 64, LINE_RATE_DGX_H100, "h100-80gb")


@pytest.fixture(scope="module")
def tradeoff():
    return tradeoff_frame("llama-2-7b", 64, LINE_RATE_DGX_H100, "h100-80gb")


def test_traffic_frame_by_hand():
    frame = traffic_frame(7 * 10**9, 64)
    sent = frame.pivot(index="stage", columns="kind", values="sent_bytes")
    # ceil(7e9 / 64) = 109,375,000: one pass 63 x 109,375,000 x 2 = 13,781,250,000 bytes.
    assert sent.loc[0].to_dict() == {"all_gather": 0, "all_reduce": 27_562_500_000,
                                     "reduce_scatter": 0}
    assert sent.loc[3].to_dict() == {"all_gather": 27_562_500_000, "all_reduce": 0,
                                     "reduce_scatter": 13_781_250_000}
    assert (frame["sent_bytes"] == frame["received_bytes"]).all()
    assert frame.attrs["model"] == 7 * 10**9 and frame.attrs["gpus"] == 64


def test_timeline_places_blocks_as_the_overlap_model_says(timeline):
    assert np.allclose([timeline.attrs["step_seconds"][s] for s in range(4)], STEPS, rtol=1e-5)
    for stage, group in timeline.groupby("stage"):
        compute = group[group["lane"] == "compute"]
        # The compute lane covers the step without gaps: forward, backward, waits.
        ends = compute.sort_values("start_seconds")[["start_seconds", "end_seconds"]].to_numpy()
        assert ends[0, 0] == 0 and np.allclose(ends[1:, 0], ends[:-1, 1])
        assert np.isclose(ends[-1, 1], STEPS[stage], rtol=1e-5)
        forward = compute[compute["block"] == "forward"].iloc[0]
        assert np.isclose(forward["end_seconds"], FORWARD, rtol=1e-5)
    stage1 = timeline[timeline["stage"] == 1].set_index("block")
    assert np.isclose(stage1.at["waiting_after_step", "end_seconds"]
                      - stage1.at["waiting_after_step", "start_seconds"], GATHER, rtol=1e-5)
    assert stage1.at["parameter_all_gather", "sent_bytes"] == PASS
    stage3 = timeline[timeline["stage"] == 3].set_index("block")
    assert stage3.at["forward_all_gather", "calls"] == 35
    assert np.isclose(stage3.at["forward_all_gather", "end_seconds"],
                      PASS / 400e9 + 35 * 296.8e-6, rtol=1e-6)
    assert not any(b.startswith("waiting") for b in stage3.index)


def test_tradeoff_frame(tradeoff):
    assert np.allclose(tradeoff["step_seconds"], STEPS, rtol=1e-5)
    assert [round(b / 1e9, 2) for b in tradeoff["memory_bytes"]] == PEAKS_GB
    assert np.allclose(tradeoff["network_wait_fraction"], [0, GATHER / STEPS[1],
                                                           GATHER / STEPS[1], 0], atol=1e-9)
    assert tradeoff["sent_bytes"].tolist() == [2 * PASS, 2 * PASS, 2 * PASS, 3 * PASS]
    # Llama-2-7B's causal attention core at 4,096 tokens: 32 layers x 4,096 x 32 x (128 + 128),
    # and its 32,000 x 4,096 embedding looked up.
    assert tradeoff.attrs["compute"] == ComputeSettings(4096, 0.4, "none", 2**30, 131_072_000)
    assert (round(COMPUTE, 6), round(FORWARD, 6)) == (0.443598, 0.147866)


def test_tradeoff_needs_data_parallel_only():
    from zerolib.core.memory.working_set import WorkingSetSettings
    with pytest.raises(ValueError, match="tensor_parallel"):
        tradeoff_frame("llama-2-7b", 64, "dgx-h100", "h100-80gb",
                       WorkingSetSettings(tensor_parallel=2))
