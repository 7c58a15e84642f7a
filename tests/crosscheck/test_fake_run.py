"""A training step on fake tensors at a real width (``zerolib.crosscheck.fake_run``), held to a
count by hand of everything alive at its peak.

The count is worked out here from the model's shapes (what FSDP2, autograd and the loss keep
at the moment the loss's backward peaks), not taken from ``explain_mechanisms``.
"""
from __future__ import annotations

import pytest
from conftest import REPO, optional_import

from zerolib.core.catalogue.models import get_model
from zerolib.crosscheck.fake_run import FakeStep, fake_step_peak, llama_config
from zerolib.crosscheck.validation.records import MECHANISMS_FILE, read_csv

HINT = "install the validate extra: pip install -e '.[validate]' (torch==2.13.0 first on this project's machines)"


def peak_by_hand(V, h, a, k, d, f, L, N, W, policy="none"):
    layer = h * a * d + 2 * h * k * d + a * d * h + 3 * h * f + 2 * h
    P = L * layer + 2 * V * h + h
    state = 4 * P // W + 8 * P // W + 4 * (9 * L + 3) + 8 * N + 2 * 4 * (d // 2)
    norm = 4 * h + 4 + 2 * h + 2 * h            # fp32 copy, 1/rms, x_hat, output
    saved = {"none": 2 * norm + 4 * a * d + 4 * k * d + 4 * a + 8 * f,
             "full": 2 * h,
             "op-sac": 2 * h + 2 * a * d + 2 * k * d + 2 * a * d + 4 * a + 2 * f + 2 * h}[policy]
    at_peak = (2 * (2 * V * h + h)        # the root's embedding, output layer, norm: bf16, unsharded
               + 2 * layer                # the last layer, prefetched for its backward
               + 12 * N * V + 4 + 4       # fp32 log-softmax, its gradient, the input's; 2 scalars
               + L * N * saved + N * norm + 2 * N * d * 2   # layers, final norm, cos and sin
               + (8 * N if policy != "none" else 0))      # position ids the checkpoints keep
    return state, state + at_peak


def test_the_recorded_full_width_steps_match_the_count():
    recorded = read_csv(REPO / "data" / MECHANISMS_FILE)
    steps = recorded[recorded["mechanism"] == "training step, full width"].set_index("case")
    for policy in ("none", "op-sac", "full"):
        _, peak = peak_by_hand(128256, 4096, 32, 8, 128, 14336, 4, 4096, 8, policy)
        assert steps.at[policy, "measured_bytes"] == peak, policy
        # PyTorch's FSDPMemTracker, run beside it, reports the same total
        assert f"Total {peak:,}" in steps.at[policy, "note"]
    assert peak_by_hand(128256, 4096, 32, 8, 128, 14336, 4, 4096, 8)[1] == 15_153_232_548


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="ranks"):
        FakeStep(ranks=0)
    with pytest.raises(ValueError, match="recompute"):
        FakeStep(recompute="selective")
    with pytest.raises(ValueError, match="time_limit"):
        FakeStep(time_limit=0)
    with pytest.raises(ValueError, match="layers"):
        FakeStep(layers=True)
    with pytest.raises(TypeError, match="config"):
        llama_config("llama")
    with pytest.raises(ValueError, match="Llama-style"):
        llama_config(get_model("gpt2"))
    with pytest.raises(TypeError, match="step"):
        fake_step_peak(get_model("llama-2-7b"), step={"ranks": 8})


@pytest.mark.torch
def test_a_small_step_matches_the_count():
    optional_import("torch", HINT)
    optional_import("transformers", HINT)
    import transformers

    from zerolib.crosscheck.fake_run import run_in_process

    V, h, a, k, d, f, L, N, W = 4096, 128, 4, 2, 32, 256, 1, 256, 4
    config = transformers.LlamaConfig(hidden_size=h, num_attention_heads=a, num_key_value_heads=k,
                                      head_dim=d, intermediate_size=f, num_hidden_layers=L,
                                      vocab_size=V, max_position_embeddings=N)
    for policy in ("full",):   # the other policies: the recorded full-width rows above
        found = run_in_process(config.to_dict(), FakeStep(ranks=W, seq_len=N, recompute=policy))
        state, peak = peak_by_hand(V, h, a, k, d, f, L, N, W, policy)
        assert (found["state_bytes"], found["peak_bytes"]) == (state, peak), policy
        assert found["by_category"]["Total"] == peak                 # FSDPMemTracker agrees
        assert found["by_category"]["UNSHARDED_PARAM"] == 2 * (2 * V * h + h)   # the root, bf16
        assert found["by_category"]["TEMP"] == 8 * N * V             # the loss's two fp32 gradients
    # a zerolib configuration becomes transformers' LlamaConfig
    llama = llama_config(get_model("llama-2-7b"))
    assert (llama.hidden_size, llama.num_hidden_layers, llama.intermediate_size, llama.vocab_size) == \
        (4096, 32, 11008, 32000)


@pytest.mark.torch
def test_the_time_bound_stops_the_run():
    optional_import("torch", HINT)
    optional_import("transformers", HINT)
    with pytest.raises(TimeoutError, match="time_limit"):
        fake_step_peak(get_model("llama-2-7b"), FakeStep(layers=1, seq_len=128, time_limit=0.2))
