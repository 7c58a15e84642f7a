"""Communication per step (ZeRO paper, Sec. VII): about 2 Psi for stages 0-2, 3 Psi for 3.

zerolib.core.step.traffic: the schedule of each stage, the bytes per collective kind, padding,
per-layer stage-3 traffic, and the paper's totals as the large-N limit. Expected values are
worked out by hand in the comments.
"""
import numpy as np
import pytest

from zerolib.core.catalogue.models import get_model, parameter_count
from zerolib.core.step.traffic import (
    GROUP_SLOTS,
    SLOTS,
    flat_traffic,
    layer_units,
    traffic,
    volume,
)


def test_small_case_by_hand():
    # 1000 parameters on 4 workers: each ring collective sends 3 chunks of 250 elements.
    v = volume(1000, 4, [0, 1, 2, 3])
    assert list(v.elements) == [1500, 1500, 1500, 2250]
    assert list(v.bytes) == [3000, 3000, 3000, 4500]  # fp16 parameters and gradients


def test_widths_follow_each_collective():
    # fp32 gradients (reduce-scatter, 750 x 4) + bf16 parameters (all-gather, 750 x 2).
    assert int(volume(1000, 4, 1, "bf16-fp32-grads").bytes) == 4500


def test_one_worker_sends_nothing():
    assert list(volume(10**9, 1, [0, 1, 2, 3]).elements) == [0, 0, 0, 0]
    assert all(int(c) == 0 for c in flat_traffic(10**9, 1, 3).calls.values())


def test_large_clusters_approach_2_and_3_psi():
    ratio = volume(7 * 10**9, 1024, [0, 1, 2, 3]).elements / (7 * 10**9)
    assert np.allclose(ratio, [2, 2, 2, 3], rtol=1e-3)
    assert volume(7 * 10**9, 1024, 3).elements / volume(7 * 10**9, 1024, 0).elements == 1.5


def test_paper_totals_are_the_large_n_limit():
    # Psi = 2^40 elements divides by every power of two up to 2^24 GPUs, so a ring pass sends
    # exactly (N - 1)/N Psi: stages 0-2 send 2 (N - 1)/N Psi, stage 3 3 (N - 1)/N Psi. The gap to
    # the paper's 2 Psi and 3 Psi is 2/N and 3/N of Psi, shrinking as N grows.
    psi = 2**40
    gpus = np.array([2**k for k in range(1, 25)])
    sent = volume(psi, gpus[:, None], [0, 1, 2, 3]).elements      # gpus x stage
    paper = np.array([2, 2, 2, 3])
    gaps = paper - sent / psi
    assert np.all(gaps > 0)                                        # always a little below
    assert np.allclose(gaps, paper / gpus[:, None], rtol=0, atol=1e-15)
    assert np.all(np.diff(gaps, axis=0) < 0)                       # shrinking with N
    assert np.all(gaps[-1] < 2e-7)                                 # within 2e-7 Psi at 2^24


def test_7b_on_64_gpus_by_hand():
    # ceil(7e9 / 64) = 109,375,000 elements per chunk, 16-bit parameters and gradients.
    t = flat_traffic(7 * 10**9, 64, [0, 1, 2, 3], "mixed-adam")
    pass_bytes = 63 * 109_375_000 * 2                             # 13,781,250,000
    kinds = t.by_kind("sent")
    assert kinds["all_reduce"].tolist() == [2 * pass_bytes, 0, 0, 0]
    assert kinds["reduce_scatter"].tolist() == [0, pass_bytes, pass_bytes, pass_bytes]
    assert kinds["all_gather"].tolist() == [0, pass_bytes, pass_bytes, 2 * pass_bytes]
    assert t.total_sent.tolist() == [27_562_500_000] * 3 + [41_343_750_000]
    handed = t.by_kind("handed")
    # The all-reduce and reduce-scatter take the whole 14 GB buffer; an all-gather one chunk.
    assert handed["all_reduce"][0] == handed["reduce_scatter"][1] == 14 * 10**9
    assert handed["all_gather"].tolist() == [0, 218_750_000, 218_750_000, 437_500_000]
    assert t.by_kind("calls")["all_gather"].tolist() == [0, 1, 1, 2]


def test_each_slot_belongs_to_its_stages():
    t = flat_traffic(10**6, 8, [0, 1, 2, 3])
    for slot in SLOTS:
        used = [stage for stage in range(4) if t.calls[slot.name][stage] > 0]
        assert tuple(used) == slot.stages, slot.name


def test_flat_buffer_padding():
    # 1001 parameters on 4 GPUs, fp32 gradients: the flat buffer is padded to 4 x 251 = 1004.
    t = flat_traffic(1001, 4, 2, "fp32-adam")
    assert int(t.handed["gradient_reduce_scatter"]) == 4 * 1004
    assert int(t.sent["gradient_reduce_scatter"]) == 4 * 3 * 251
    # The all-reduce of plain data parallelism hands over the unpadded buffer.
    assert int(flat_traffic(1001, 4, 0, "fp32-adam").handed["gradient_all_reduce"]) == 4 * 1001


def test_layers_of_a_preset():
    units = layer_units("llama-2-7b")
    h, f, v = 4096, 11008, 32000
    block = 4 * h * h + 3 * h * f + 2 * h          # q, k, v, o; gate, up, down; two RMSNorms
    assert block == 202_383_360
    assert units == (v * h, *[block] * 32, h, v * h)   # embedding, blocks, final norm, output
    assert sum(units) == parameter_count("llama-2-7b")
    # GPT-2's output projection is tied to the embedding: gathered with it, not again.
    assert sum(layer_units("gpt2")) == parameter_count("gpt2")
    assert len(layer_units("gpt2")) == 2 + 12 + 1   # token and position embeddings, final norm


def test_dense_first_layers_are_gathered_as_they_are():
    """DeepSeek-V2-Lite (tests/data/deepseek-v2-lite.json): its first layer is dense, the other
    26 hold 64 routed experts, 2 shared ones and a router. Stage 3 gathers each layer whole, so
    the units are one dense block, then 26 expert blocks, and they add up to the model's 15,748,
    993,024 parameters (transformers 5.24 on the meta device, tests/data/README.md)."""
    from conftest import REPO

    from zerolib.core.catalogue.hf_config import model_from_config
    config = model_from_config(REPO / "tests" / "data" / "deepseek-v2-lite.json")
    units = layer_units(config)
    assert len(units) == 1 + 27 + 2                  # embedding, layers, final norm, output layer
    dense, expert = units[1], units[2]
    assert units[2:28] == (expert,) * 26 and dense != expert
    h = config.hidden
    # what an expert layer adds to a dense one: the router, 64 experts and 2 shared experts of
    # 1408 in place of one dense MLP of 10944 (three h x width matrices each)
    assert expert - dense == h * 64 + 3 * h * 1408 * (64 + 2) - 3 * h * 10944
    assert sum(units) == 15_748_993_024


def test_a_mixtures_layers_hold_every_expert():
    """Stage 3 gathers a mixture-of-experts block whole: all 8 experts, not one. Mixtral-8x7B's
    units add up to its published 46,702,792,704 parameters (Mistral AI's model card)."""
    units = layer_units("mixtral-8x7b")
    h, f, kv, v, e = 4096, 14336, 1024, 32000, 8
    block = 2 * h * h + 2 * h * kv + h * e + e * 3 * h * f + 2 * h   # attention, router, experts, norms
    assert units == (v * h, *[block] * 32, h, v * h)
    assert sum(units) == 46_702_792_704


def test_stage3_pads_each_layer_on_its_own():
    # Three layers of 1 element on 3 GPUs: one flat buffer is one chunk per GPU, but each layer
    # padded alone is 3 chunks: an all-gather pass sends 2 x 1 against 2 x 3 elements.
    per_layer = traffic([1, 1, 1], 3, 3, "fp32-adam")
    flat = traffic(3, 3, 3, "fp32-adam")
    assert int(per_layer.sent["forward_all_gather"]) == 4 * 2 * 3
    assert int(flat.sent["forward_all_gather"]) == 4 * 2 * 1
    assert int(per_layer.calls["forward_all_gather"]) == 3 and per_layer.layers == 3
    # Stages 0-2 treat the layers as one flat buffer either way.
    assert (traffic([1, 1, 1], 3, 2).total_sent == traffic(3, 3, 2).total_sent).all()


def test_llama_on_64_gpus_needs_no_padding():
    # Every Llama-2-7B layer divides by 64 (131,072,000 / 64 = 2,048,000; 202,383,360 / 64 =
    # 3,162,240; 4096 / 64 = 64): three passes of 63/64 of P in 2 bytes.
    p = parameter_count("llama-2-7b")
    t = traffic("llama-2-7b", 64, 3)
    assert int(t.total_sent) == 3 * 63 * (p // 64) * 2 == 39_798_767_232
    assert int(t.calls["forward_all_gather"]) == 35
    assert get_model("llama-2-7b").layers + 3 == 35


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="stage"):
        flat_traffic(10, 2, 4)
    with pytest.raises(ValueError, match="units"):
        traffic([10, 0], 2, 3)
    with pytest.raises(ValueError, match="model must be one of"):
        traffic("llama-9", 2, 3)
    with pytest.raises(ValueError, match="gpus"):
        traffic("gpt2", 0, 3)


def test_the_sweep_path_equals_the_slot_sums():
    # by_kind("sent") of a flat count in whole bytes takes a shortcut; it must give what summing
    # the slots gives, over random settings (and sub-byte widths take the slot sums).
    rng = np.random.default_rng(1)
    params, gpus = rng.integers(1, 10**12, 5000), rng.integers(1, 5000, 5000)
    stage = rng.integers(0, 4, 5000)
    for layout in ("mixed-adam", "fp32-adam", "bf16-fp32-grads"):
        t = flat_traffic(params, gpus, stage, layout)
        fast = t.by_kind("sent")
        for kind in fast:
            slow = sum(t.sent[s.name] for s in GROUP_SLOTS if s.kind == kind)
            assert np.array_equal(fast[kind], slow), (layout, kind)
    from zerolib.core.memory.accounting import Layout
    half = flat_traffic(6, 6, 1, Layout.custom(0.5, 0.5, 1))
    # 6 elements on 6 GPUs: a pass sends 5 chunks of 1 element, 20 bits, rounded up to 3 bytes.
    assert int(half.by_kind("sent")["reduce_scatter"]) == 3
