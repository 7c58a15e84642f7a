"""Notebook 08's prose (going further: ZeRO beside model parallelism): every number and judgement
a markdown cell states, recomputed with zerolib.

Each test reads one markdown cell (by id), normalises its whitespace and checks the phrases that
carry numbers against values computed here, so a change in the library that moves a number makes
the sentence fail until the text (and the executed notebook) follow.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pandas as pd
import pytest
from prose_support import markdown_cells, says

import zerolib as zl
from zerolib.core.memory.activations import checkpoint_terms
from zerolib.core.plan_settings import Search
from zerolib.core.planner import PLAN_LEFT_OUT, describe_configuration
from zerolib.core.step.engines import DEFAULT_ENGINE, get_engine
from zerolib.core.step.offload_traffic import host_traffic, node_host_settings
from zerolib.core.step.parallel import bubble_fraction
from zerolib.core.step.traffic import flat_traffic
from zerolib.core.units import format_value
from zerolib.paths import CHAPTER

STEM = "08-zero-beside-model-parallelism"
NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / f"{STEM}.ipynb"
GB = 10**9
M = "llama-2-70b"
A100 = zl.get_device("a100-80gb")
SELECTIVE = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective")
FULL = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="full")


@pytest.fixture(scope="module")
def cells() -> dict[str, str]:
    return markdown_cells(STEM)


@pytest.fixture(scope="module")
def a100_plan():
    return zl.plan(M, 64, 8, "a100-80gb", 4096, 1024)


@pytest.fixture(scope="module")
def h100_plan():
    return zl.plan(M, 64, 8, "h100-80gb", 4096, 1024)


def gb(n_bytes, places=2) -> str:
    return f"{n_bytes / GB:,.{places}f}"


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def stage3(gpus, settings=SELECTIVE):
    return zl.peak(M, gpus, 3, settings)


def acts(t, p, sp, r):
    options = zl.WorkingSetSettings(sequence_parallel=sp, recompute="selective",
                                    flash_attention=True).activation_options
    return int(zl.activation_bytes_per_gpu(M, 4096, 1, t, p, pipeline_stage=r, options=options))


CASES = {
    "full": dict(tensor_parallel=1, pipeline_parallel=1, data_parallel=64, stage=3, micro_batches=16,
                 recompute="full"),
    "t8": dict(tensor_parallel=8, pipeline_parallel=1, data_parallel=8, stage=1, micro_batches=128,
               sequence_parallel=True, recompute="selective"),
    "p8": dict(tensor_parallel=8, pipeline_parallel=8, data_parallel=1, stage=0, micro_batches=1024,
               sequence_parallel=True, recompute="selective"),
    "p8_16": dict(tensor_parallel=8, pipeline_parallel=8, data_parallel=1, stage=0, micro_batches=16,
                  sequence_parallel=True, recompute="selective"),
}


def timed(case):
    return zl.parallel_step_time(M, zl.cluster_interconnect("dgx-a100", 8), A100, seq_len=4096,
                                 micro_batch=1, **CASES[case])


def test_title(cells):
    text = cells["title"]
    says(text, "(06-when-zero-is-not-enough.ipynb)", "(04-will-it-fit.ipynb)",
         "(05-the-price-of-zero.ipynb)", "[words](05-the-price-of-zero.ipynb#The-words)",
         "under DeepSpeed 0.19.8's defaults", "64 A100 80GB and on 8 DGX H100 nodes",
         "8,192 to 131,072 tokens", "partitioned activation checkpoints (P_a)",
         "[the ZeRO paper](https://arxiv.org/abs/1910.02054) (Rajbhandari et al., SC20), Sec. VI-A")
    assert "Memory Optimizations Toward" not in " ".join(cells.values())      # short form only
    # The collectives are defined once, in 05: here they are linked, never set in bold.
    for term in ("all-reduce", "reduce-scatter", "all-gather"):
        assert f"**{term}" not in " ".join(cells.values())
    says(cells["time-intro"], "[collectives](05-the-price-of-zero.ipynb#The-words)")


def test_time_intro(cells):
    says(cells["time-intro"], "1,024 sequences of 4,096 tokens (Llama 2's 4M tokens)", "40% of peak")
    assert 1024 * 4096 == 4_194_304   # "4M tokens" (Touvron et al., Table 1)
    says(cells["time-intro"], "Times here are for **DeepSpeed 0.19.8 at its defaults**, zerolib's default engine",
         "except the first layer's gather of every micro-batch",
         "(`overlap_comm` is on for stage 3 only), hidden behind nothing, "
         "stages 0 and 1 once per step after the last backward",
         "(NVLink 3: 230 of 300 GB/s, InfiniBand HDR 24 of 25 GB/s")
    ds = get_engine()
    assert DEFAULT_ENGINE == "deepspeed" and ds.label == "DeepSpeed 0.19.8"
    assert ds.overlap.backward_hidden == (3,) and ds.overlap.first_gather_exposed
    assert ds.overlap.forward_hidden and not ds.overlap.post_step_gather_hidden
    assert ds.every_micro_batch == (2, 3)       # stages 0 and 1 reduce once per step
    for name, achieved, line in (("nvlink3", 230, 300), ("ib-hdr", 24, 25)):
        link = zl.get_link(name)
        assert (link.achieved, link.bandwidth) == (achieved * GB, line * GB)
    # The step is timed at the achieved rates: at line rate it is shorter.
    fast = zl.parallel_step_time(M, zl.cluster_interconnect("dgx-a100", 8, "line-rate"), A100,
                                 seq_len=4096, micro_batch=1, **CASES["t8"])
    assert float(fast.step_seconds) < float(timed("t8").step_seconds)
    assert bubble_fraction(8, 16) == 7 / 16


def test_time_read(cells):
    text = cells["time-read"]
    full, t8, p8, p16 = (timed(c) for c in ("full", "t8", "p8", "p8_16"))
    says(text, f"costs {float(full.parts['compute']):.1f} s of compute",
         f"need about {float(t8.parts['compute']):.0f} s",
         f"but for the first gather of each of its 16 micro-batches: {float(full.parts['data_parallel']):.2f} s",
         f"spends {float(t8.parts['tensor']):.1f} s per step in its collectives: "
         f"{float(t8.parts['tensor'] / t8.step_seconds):.1%} of its {float(t8.step_seconds):.1f} s step",
         f"after the backward adds {float(t8.parts['data_parallel']):.2f} s, so "
         f"{float(t8.network_wait_fraction):.1%} of that step waits for the network",
         "the table's \"network\" column, the tensor-parallel and ZeRO's waits together, each a share "
         "of the whole step",
         f"idles {float(p8.parts['bubble']):.2f} s in its bubble, {float(p8.bubble_fraction):.2%}",
         f"the same {float(p16.parts['bubble']):.2f} s are {float(p16.bubble_fraction):.0%} of the step",
         "(*p* − 1)/(*m* + *p* − 1) = 7/23")
    # Issue 23: two shares of one step, both of the whole step: the tensor-parallel collectives
    # alone (29.609 / 254.498 = 11.6%) and everything that waits for the network (12.4%).
    tensor_share = float(t8.parts["tensor"] / t8.step_seconds)
    network_share = float(t8.network_wait_fraction)
    assert network_share == pytest.approx(float(t8.network_seconds / t8.step_seconds))
    assert network_share - tensor_share == pytest.approx(float(t8.parts["data_parallel"] / t8.step_seconds))
    assert f"{tensor_share:.1%}" != f"{network_share:.1%}"
    assert f"{float(t8.parts['tensor'] / t8.parts['compute']):.1%}" not in text    # not a share of compute
    # "hides behind that compute but for the first gather": all that waits is ZeRO-3's.
    assert float(full.parts["data_parallel"]) == float(full.network_seconds) > 0
    assert float(full.network_wait_fraction) < 0.001
    assert float(t8.network_seconds) == pytest.approx(float(t8.parts["tensor"] + t8.parts["data_parallel"]))
    assert float(p8.parts["bubble"]) == pytest.approx(float(p16.parts["bubble"]))
    assert float(p16.bubble_fraction) == pytest.approx(7 / 23)


def test_planner_intro(cells):
    says(cells["planner-intro"], "micro-batch 1 to 8", "the ring of the group's GPUs",
         "the all-reduce among the group's replicas once per step", "PCIe 4.0 x16 unless told")
    says(cells["planner-intro"], "every number of model chunks *v* Megatron-LM accepts (*p* × *v* dividing the layers)",
         "DeepSpeed 0.19.8 unless told", "PyTorch FSDP2 runs its stages 0, 2 and 3",
         "Megatron-LM's distributed optimizer offers stages 0 and 1",
         "the CPU's optimizer step at the host's memory-bandwidth roofline",
         "(FSDP2, Megatron-LM) it searches context parallelism too, *c* = 1, 2, 4, 8 and 16")
    # The default search: every degree up to 16 under an engine with ring attention, 1 elsewhere
    for engine in ("fsdp2", "megatron"):
        assert zl.plan(M, 64, 8, "a100-80gb", 4096, 1024, engine=engine, stages=(0,), recompute=("none",),
                       max_micro_batch=1).settings.context_parallel == (1, 2, 4, 8, 16)
    settings = zl.plan(M, 8, 8, "a100-80gb", 4096, 64).settings
    assert settings.max_micro_batch == 8 and settings.host_link.label == "PCIe 4.0 x16"
    assert settings.engine.name == "deepspeed" and settings.engine.pipeline_stages == (0, 1)
    fsdp2, megatron = get_engine("fsdp2"), get_engine("megatron")
    assert fsdp2.stages == fsdp2.pipeline_stages == (0, 2, 3) and megatron.stages == (0, 1)
    # Every chunk count v >= 2 with p x v dividing the 80 layers is planned at p = 2.
    valid = zl.plan(M, 8, 8, "a100-80gb", 4096, 64, stages=(1,), recompute=("none",),
                    max_micro_batch=1).valid
    chunks = set(valid[valid["pipeline_parallel"] == 2]["chunks"])
    assert chunks == {1} | {v for v in range(2, 41) if 80 % (2 * v) == 0}
    # Once per step: ZeRO-2 over groups of 8 of 64 (one node each) hides its reduce-scatter
    # behind every micro-batch's backward; what is exposed, the replicas' all-reduce across the
    # nodes and the gather after the step, does not grow with the micro-batches.
    def dp(group, m):
        return float(zl.parallel_step_time(
            M, zl.cluster_interconnect("dgx-a100", 8), A100, seq_len=4096, micro_batch=1,
            tensor_parallel=1, pipeline_parallel=1, data_parallel=64, stage=2, micro_batches=m,
            shard_group=group, engine="paper").parts["data_parallel"])   # groups at stage 2
    assert dp(8, 1) == dp(8, 4) > 0 and dp(8, 1) != dp(64, 1)


def test_rejected_read(cells, a100_plan):
    text = cells["rejected-read"]
    c = a100_plan.counts()
    rules = {r.rule: r for r in a100_plan.rejected.itertuples()}
    says(text, f"Of {c['configurations']:,} configurations, {c['runnable']:,} can run and "
               f"{c['fit']:,} fit",
         f"{rules['kv_heads'].configurations:,} split the 8 key/value heads",
         "so no schedule rule rejects any",
         f"{rules['global_batch'].configurations:,} cannot cut",
         f"{rules['pipeline_zero'].configurations:,} put ZeRO-2",
         f"{rules['host_unknown'].configurations:,} offload to CPU memory",
         f"{rules['capacity'].configurations:,} peak above", f"closest at {gb(rules['capacity'].example_bytes)} GB, "
         f"{(rules['capacity'].example_bytes - A100.capacity) / 1e6:.2f} MB over its {gb(A100.capacity)} GB",
         "fit, under DeepSpeed 0.19.8's rules")
    # Only the schedules Megatron-LM accepts are enumerated: no schedule rule rejects any.
    assert set(rules) == {"kv_heads", "global_batch", "pipeline_zero", "host_unknown", "capacity"}
    assert a100_plan.settings.engine.name == "deepspeed"
    fsdp2 = zl.plan(M, 64, 8, "a100-80gb", 4096, 1024, engine="fsdp2", context_parallel=(1,))
    assert "pipeline_zero" not in set(fsdp2.rejected["rule"]) and 1 not in set(fsdp2.valid["stage"])
    fits = fsdp2.fits
    pipe = fits[(fits["pipeline_parallel"] > 1) & (fits["stage"] >= 2)].iloc[0]
    assert pipe["stage"] == 3
    assert describe_configuration(fits.iloc[0]) == describe_configuration(a100_plan.fits.iloc[0])
    says(text, "and without context parallelism (`context_parallel=(1,)`), "
               f"{fsdp2.counts()['configurations']:,} configurations give {fsdp2.counts()['fit']:,} that fit; "
               "the fastest stays the same",
         f"a pipeline under ZeRO-3 ranks {ordinal(int(pipe['rank']))}: {describe_configuration(pipe)}, "
         f"{pipe['step_seconds']:.1f} s")
    # FSDP2's plan as asked searches C up to 16 (torchtitan runs ring attention): each
    # configuration once per degree, five times the configurations; its first has C 2, t 1.
    asked = zl.plan(M, 64, 8, "a100-80gb", 4096, 1024, engine="fsdp2")
    c = asked.counts()
    assert c["configurations"] == 5 * fsdp2.counts()["configurations"]
    first, deepspeed = asked.fits.iloc[0], a100_plan.fits.iloc[0]
    assert (first["context_parallel"], first["tensor_parallel"]) == (2, 1)
    assert first["step_seconds"] < deepspeed["step_seconds"]
    same = asked.fits[asked.fits["context_parallel"] == 1].iloc[0]
    assert describe_configuration(same) == describe_configuration(deepspeed)
    says(text, f"gives {c['fit']:,} that fit of {c['configurations']:,}, and its first trades tensor for context "
               f"parallelism: {describe_configuration(first)}, {first['step_seconds']:.1f} s, "
               f"DeepSpeed's fastest ranking {ordinal(int(same['rank']))} (the same "
               f"{deepspeed['step_seconds']:.1f} s)")
    assert zl.get_model(M).kv_heads == 8


def test_ranking_read(cells, a100_plan):
    text = cells["ranking-read"]
    fits = a100_plan.fits
    best = fits.iloc[0]
    says(text, f"The fastest configuration that fits is {describe_configuration(best)}: "
               f"{gb(best['peak_bytes'])} GB per GPU, {best['step_seconds']:.1f} s per step, "
               f"{best['network_wait_fraction']:.1%} of it waiting")
    assert (best["tensor_parallel"], best["sequence_parallel"], best["stage"]) == (2, True, 3)
    assert best["recompute"] == "none"
    # Selective recomputation of the same configuration repeats the attention core.
    same = ["tensor_parallel", "pipeline_parallel", "data_parallel", "sequence_parallel", "chunks",
            "micro_batch", "stage", "shard_group", "offload"]
    twin = fits[(fits[same] == best[same]).all(axis=1) & (fits["recompute"] == "selective")].iloc[0]
    says(text, f"recomputation ranks {ordinal(int(twin['rank']))}, "
               f"{twin['step_seconds'] - best['step_seconds']:.2f} s slower",
         f"selective saves only {gb(best['peak_bytes'] - twin['peak_bytes'])} GB")
    assert acts(2, 1, True, 0) * 2 == pytest.approx(acts(1, 1, False, 0), rel=0.01)  # "halves"
    plain = fits[(fits["tensor_parallel"] == 1) & (fits["pipeline_parallel"] == 1)]
    assert set(plain["recompute"]) == {"full"} and set(plain["stage"]) == {3}
    says(text, f"({len(plain)} configurations, all ZeRO-3)",
         f"ranks {ordinal(int(plain.iloc[0]['rank']))} at {plain.iloc[0]['step_seconds']:.1f} s")
    t8 = fits[fits["tensor_parallel"] == 8].iloc[0]
    pipe = fits[fits["pipeline_parallel"] > 1].iloc[0]
    says(text, f"first appears at rank {int(t8['rank'])} ({t8['step_seconds']:.1f} s)",
         f"a pipeline at rank {int(pipe['rank'])} ({pipe['step_seconds']:.1f} s)")
    # The first smaller shard group ties with its whole group in time and peaks higher.
    small = fits[fits["shard_group"] < fits["data_parallel"]].iloc[0]
    same = ["tensor_parallel", "pipeline_parallel", "sequence_parallel", "chunks", "micro_batch",
            "recompute", "stage", "offload"]
    whole = fits[(fits[same] == small[same]).all(axis=1)
                 & (fits["shard_group"] == fits["data_parallel"])].iloc[0]
    assert (small["shard_group"], small["data_parallel"], small["tensor_parallel"]) == (8, 16, 4)
    assert small["step_seconds"] < whole["step_seconds"] and small["peak_bytes"] > whole["peak_bytes"]
    # The bytes hid already: what differs is the exposed first gather (data-parallel time).
    assert small["compute_seconds"] == whole["compute_seconds"]
    assert small["tensor_seconds"] == whole["tensor_seconds"]
    says(text, f"A smaller shard group first appears at rank {int(small['rank'])}",
         f"ring of 8 instead of 16, {whole['step_seconds'] - small['step_seconds']:.2f} s faster",
         f"adds memory ({gb(small['peak_bytes'])} GB against {gb(whole['peak_bytes'])} GB)",
         "ZeRO alone, with no model parallelism (*t* = *p* = 1)")
    # Gradient accumulation: ZeRO-3 gathers before every micro-batch's forward and backward.
    text = cells["accumulation-read"]
    m = int(best["micro_batches"])
    assert m == 1024 // 32
    share = int(zl.parameters_per_gpu(M, 2, 1))
    one, many = (flat_traffic(share, 32, 3, engine="deepspeed", micro_batches=k) for k in (1, m))
    gathers = int(many.repeats["forward_all_gather"]) + int(many.repeats["backward_all_gather"])
    assert gathers == 2 * m == 64 and int(many.repeats["gradient_reduce_scatter"]) == m
    # Each gather pass sends (d - 1)/d of this GPU's 2-byte share; three passes a micro-batch.
    assert int(many.sent["forward_all_gather"]) == m * 2 * (-(-share // 32)) * 31
    says(text, f"runs {m} micro-batches per step", f"{gathers} gathers of its share of the weights a step",
         f"Each GPU sends {int(many.total_sent) / 1e12:.2f} TB a step where one micro-batch "
         f"would send {int(one.total_sent) / GB:.1f} GB "
         f"({int(many.total_sent) / int(one.total_sent):.0f} times as much)",
         f"first layer's gather of every micro-batch: {best['data_parallel_seconds']:.2f} s a step")
    assert get_engine().overlap.first_gather_exposed


def test_h100_read(cells, a100_plan, h100_plan):
    text = cells["h100-read"]
    from zerolib.core.step.collectives import ring_timing
    nvls = float(ring_timing(zl.interconnect("dgx-h100"), "all_reduce", 8)[1])
    says(text, f"{nvls / GB:.0f} GB/s for an all-reduce inside the node, which NCCL runs on the "
               "NVSwitches, NVLink SHARP")
    a, h = a100_plan.fits.iloc[0], h100_plan.fits.iloc[0]
    assert h100_plan.counts()["fit"] == a100_plan.counts()["fit"]
    assert describe_configuration(a) == describe_configuration(h)
    h100 = zl.get_device("h100-80gb")
    assert h100.capacity == A100.capacity
    plain = h100_plan.fits[(h100_plan.fits["tensor_parallel"] == 1)
                           & (h100_plan.fits["pipeline_parallel"] == 1)]
    says(text, f"the same {h100_plan.counts()['fit']:,} configurations fit",
         f"{h['step_seconds']:.1f} s per step, {a['step_seconds'] / h['step_seconds']:.2f} times faster",
         f"computes {h100.peak_flops / A100.peak_flops:.2f} times faster",
         f"NVLink is only {zl.get_link('nvlink4').bandwidth / zl.get_link('nvlink3').bandwidth:.1f} times",
         f"ports {zl.get_link('ib-ndr').bandwidth / zl.get_link('ib-hdr').bandwidth:.0f} times faster",
         f"at the rates NCCL achieves, {zl.get_link('nvlink4').achieved / GB:.0f} against "
         f"{zl.get_link('nvlink3').achieved / GB:.0f} GB/s, "
         f"{zl.get_link('nvlink4').achieved / zl.get_link('nvlink3').achieved:.1f} times",
         "The best configuration without model parallelism ranks",
         f"grows from {a['network_wait_fraction']:.1%} to {h['network_wait_fraction']:.1%}",
         f"ranks {ordinal(int(plain.iloc[0]['rank']))} at {plain.iloc[0]['step_seconds']:.1f} s")
    assert h["network_wait_fraction"] > a["network_wait_fraction"]


def test_honesty_read(cells):
    text = cells["honesty-read"]
    says(text, "never reports a configuration as fitting when a term of its peak is unknown",
         "NVMe, whose capacity is not judged, is not planned",
         "timed on their PCIe copies and on the CPU's optimizer step",
         "at the host's memory-bandwidth roofline, a lower bound unless a measured CPU-Adam rate is given")
    blind = zl.plan(M, 8, 8, "a100-80gb", 4096, 64, max_micro_batch=1)
    assert (blind.fits["offload"] == "none").all()
    known = zl.plan(M, 8, 8, "a100-80gb", 4096, 64, max_micro_batch=1, host_memory=4 * 2**40)
    assert (known.fits["offload"] != "none").any() and known.fits["step_seconds"].notna().all()
    assert "nvme" not in " ".join(map(str, zl.plan(M, 8, 8, "a100-80gb", 4096, 64).settings.offload))
    assert any("NVMe" in line for line in PLAN_LEFT_OUT)
    # The CPU's optimizer step is timed now (issue 22, item 5): only the GPU's is left out.
    assert any("CPU's step is timed" in line for line in PLAN_LEFT_OUT)


def test_explorer_intro(cells):
    text = cells["explorer-intro"]
    assert zl.PlannerExplorer().plan.settings.engine.name == "deepspeed"     # the class's default
    e = zl.PlannerExplorer(engine="fsdp2")
    assert e.plan.settings.shard_groups == "all"                             # "every shard group"
    assert e.plan.counts() == zl.plan(M, 64, 8, "a100-80gb", 4096, 1024, engine="fsdp2",
                                      context_parallel=(1,)).counts()
    assert zl.PlannerExplorer.STARTS_AT["context_parallel"] == 1 == e.plan.settings.context_parallel[-1]
    deepspeed = zl.plan(M, 64, 8, "a100-80gb", 4096, 1024)
    fsdp2 = get_engine("fsdp2")
    assert 1 not in fsdp2.stages and not fsdp2.zeropp                         # no stage 1, no offload
    offered = zl.plan(M, 8, 8, "a100-80gb", 4096, 64, engine="fsdp2", host_memory=2**40)
    assert set(offered.valid["offload"].astype(str)) == {"none"}
    fits = e.plan.fits
    assert describe_configuration(fits.iloc[0]) == describe_configuration(deepspeed.fits.iloc[0])
    # Issue 23: the explorer's count differs from the table's (3,309 against 1,000); say why:
    # the same shard groups (every G, zerolib plan's default too), another engine.
    default_groups = Search().shard_groups
    explorer_groups = zl.PlannerExplorer.STARTS_AT["shard_groups"]
    assert default_groups == explorer_groups == e.plan.settings.shard_groups == "all"
    assert deepspeed.settings.shard_groups == "all"
    assert e.controls["shard_groups"].value == "all"
    assert dict(e.controls["shard_groups"].options)["every G"] == "all"
    says(text, "It searches every shard group, as the planner above does (its \"Shard groups\" buttons "
               "start on \"every G\", the default of `zerolib plan` too), but starts on **PyTorch FSDP2** "
               "(`zerolib plan --engine fsdp2`)",
         f"so {e.plan.counts()['fit']:,} configurations fit where DeepSpeed's rules give "
         f"{deepspeed.counts()['fit']:,}",
         "(the comparison under the rejections above); the same one comes first",
         "its text says which engine the ranking is for")
    assert "Ranked for PyTorch FSDP2" in e.summary.value


def _fastest(explorer):
    return explorer.plan.fits.iloc[0]


def test_explorer_things_to_try(cells):
    """Each 'thing to try', done on the explorer the notebook starts, shows what it predicts."""
    text = cells["explorer-read"]

    def explorer(**changes):
        e = zl.PlannerExplorer(model=M, gpus=64, gpus_per_node=8, device="a100-80gb", engine="fsdp2")
        for name, value in changes.items():
            e.controls[name].value = value
        return e

    start = explorer()
    first = _fastest(start)
    e = explorer(gpus=128)
    best = _fastest(e)
    says(text, f"The fastest becomes {describe_configuration(best)}: "
               f"{format_value(best['step_seconds'])} s per step, half of 64 GPUs' "
               f"{format_value(first['step_seconds'])} s")
    assert best["step_seconds"] == pytest.approx(first["step_seconds"] / 2, rel=0.01)
    e = explorer(seq_len=8192)
    best = _fastest(e)
    says(text, f"only {e.plan.counts()['fit']:,} of {e.plan.counts()['runnable']:,} runnable",
         f"(at 4,096: {start.plan.counts()['fit']:,})",
         f"tensor parallelism: {describe_configuration(best)}, {format_value(best['step_seconds'])} s")
    assert best["tensor_parallel"] > first["tensor_parallel"]
    e = explorer(seq_len=16384)
    longest = _fastest(e)
    says(text, f"Sequence 16,384: {describe_configuration(longest)}, "
               f"{format_value(longest['step_seconds'])} s")
    assert longest["tensor_parallel"] > best["tensor_parallel"]
    e = explorer(device="h100-80gb")
    h = _fastest(e)
    assert describe_configuration(h) == describe_configuration(first)
    says(text, f"the same configuration comes first, at {format_value(h['step_seconds'])} s")
    e = explorer(model="llama-2-7b")
    small = _fastest(e)
    assert (small["tensor_parallel"], small["pipeline_parallel"], small["stage"]) == (1, 1, 3)
    assert small["shard_group"] < small["data_parallel"]
    # Issue 23: the row is not plain data parallelism (stage 0) but ZeRO-3 in groups.
    assert small["stage"] == 3 and small["offload"] == "none"
    says(text, f"Model llama-2-7b: the first row, {describe_configuration(small)}, "
               f"{format_value(small['step_seconds'])} s with {small['network_wait_fraction']:.0%} of it waiting",
         "is not plain data parallelism: it is ZeRO-3 with no model parallelism (*t* = *p* = 1), its "
         f"model state sharded over groups of {int(small['shard_group'])} GPUs and replicated across the "
         f"{int(small['data_parallel']) // int(small['shard_group'])} groups (FSDP2's hybrid sharding)")
    e = explorer(model="llama-3.1-405b")
    assert e.plan.counts()["fit"] == 0
    says(text, f"({e.plan.counts()['runnable']:,} configurations can run, none under the line)")
    ds = explorer(engine="deepspeed")
    assert ds.plan.counts() == zl.plan(M, 64, 8, "a100-80gb", 4096, 1024).counts()
    assert not ((ds.plan.fits["pipeline_parallel"] > 1) & (ds.plan.fits["stage"] >= 2)).any()
    says(text, f"Engine DeepSpeed 0.19.8: the plan above, {ds.plan.counts()['fit']:,} fit")
    e = explorer(engine="deepspeed", host_memory=2**40)
    fits = e.plan.fits
    offloaded = fits[fits["offload"] != "none"]
    top = _fastest(e)
    kept = fits[fits["offload"] == "none"].iloc[0]
    assert describe_configuration(kept) == describe_configuration(first)
    assert top["offload"] == "optimizer+parameters" and not top["sequence_parallel"]
    assert top["tensor_seconds"] < first["tensor_seconds"]            # "fewer tensor-parallel calls"
    per_gpu = -(-int(zl.parameters_per_gpu(M, top["tensor_parallel"], 1)) // int(top["shard_group"]))
    cpu = float(host_traffic(int(zl.parameters_per_gpu(M, 2, 1)), 32, 3, placement=zl.Placement(
        gpus_per_node=8, offload_optimizer="cpu", offload_params="cpu")).cpu_seconds(
        node_host_settings("dgx-a100"), 8))
    # "its PCIe copies hide": beyond the first gathers all it waits for is the CPU's step.
    assert top["data_parallel_seconds"] == pytest.approx(kept["data_parallel_seconds"] + cpu)
    lead = kept["step_seconds"] - top["step_seconds"]
    assert 0 < lead < cpu       # a CPU step twice as long (half the roofline's rate) loses the lead
    says(text, f"{len(offloaded):,} offloaded configurations now fit too, and one comes first: "
               f"{describe_configuration(top)}, {format_value(top['step_seconds'])} s",
         f"Its whole lead is {lead:.2f} s",
         f"Adam over {8 * per_gpu / 1e9:.2f} billion parameters every step, now timed: "
         f"{cpu:.2f} s at the host's memory-bandwidth roofline")
    faster = explorer(engine="deepspeed", host_memory=2**40, host_link="pcie5-x16")
    assert describe_configuration(_fastest(faster)) == describe_configuration(top)
    assert _fastest(faster)["step_seconds"] == top["step_seconds"]    # "does not move"
    alone, quicker = (x.plan.fits[x.plan.fits["offload"] == "optimizer"].iloc[0] for x in (e, faster))
    assert describe_configuration(alone) == describe_configuration(quicker)
    assert alone["rank"] == quicker["rank"]
    says(text, f"Offloading the optimizer alone (rank {int(alone['rank'])})",
         f"gains {alone['step_seconds'] - quicker['step_seconds']:.2f} s")


def test_summary(cells, a100_plan, h100_plan):
    text = cells["summary"]
    c = a100_plan.counts()
    a, h = a100_plan.fits.iloc[0], h100_plan.fits.iloc[0]
    fsdp2 = zl.plan(M, 64, 8, "a100-80gb", 4096, 1024, engine="fsdp2", context_parallel=(1,))
    assert describe_configuration(fsdp2.fits.iloc[0]) == describe_configuration(a)
    asked = zl.plan(M, 64, 8, "a100-80gb", 4096, 1024, engine="fsdp2").fits.iloc[0]

    def activations(pa):
        run = zl.Run.of(M, 64, seq_len=4096, micro_batch=1, recompute="full", tensor_parallel=8,
                        partition_activations=pa, device=A100, stages=(3,))
        return zl.estimate(run).stages[0]["working_set"]["activations"]

    says(text, "(*p* − 1)/(*v* *m*) of the ideal time",
         f"({2 * int(a['micro_batches'])} times a step for the planner's winner)",
         f"On 64 A100 80GB {c['fit']:,} of {c['configurations']:,} configurations fit under DeepSpeed 0.19.8's rules",
         f"fastest by the planner's model is {describe_configuration(a)}, {a['step_seconds']:.1f} s per step",
         f"on 8 DGX H100 nodes the same configuration takes {h['step_seconds']:.1f} s",
         f"Under PyTorch FSDP2's rules, which run ZeRO-2 and ZeRO-3 beside a pipeline, "
         f"{fsdp2.counts()['fit']:,} configurations fit without context parallelism and the same one comes first",
         f"context parallelism its plan searches by default, {describe_configuration(asked)} comes first, "
         f"{asked['step_seconds']:.1f} s.",
         f"at 131,072 tokens on 64 H100 it is "
         f"{_cp(131072)[0]['step_seconds'] / _cp(131072)[1]['step_seconds']:.2f} times faster",
         f"cuts the activations of *t* 8 under full recomputation from {gb(activations(False))} GB "
         f"to {gb(activations(True))} GB")
    assert describe_configuration(a) == describe_configuration(h)
    assert bubble_fraction(8, 16, 2) == pytest.approx(7 / 32)          # (p - 1) / (v G)
    bullets = [line for line in text.split(" - ")[1:]]
    assert 3 <= len(bullets) <= 5
    previous, following = CHAPTER[CHAPTER.index(STEM) - 1], CHAPTER[CHAPTER.index(STEM) + 1]
    says(text, f"Previous: [7 · Shard groups and offload]({previous}.ipynb) · "
               f"Next: [9 · Size your own model]({following}.ipynb) · [Contents](00-index.ipynb)")


def test_zero_r_read(cells):
    text = cells["zero-r-read"]

    def activations(pa, cpu):
        run = zl.Run.of(M, 64, seq_len=4096, micro_batch=1, recompute="full", tensor_parallel=8,
                        partition_activations=pa, cpu_checkpointing=cpu, device=A100, stages=(3,))
        return zl.estimate(run).stages[0]["working_set"]["activations"]

    plain, pa, cpu = activations(False, False), activations(True, False), activations(True, True)
    whole = 2 * 4096 * 8192                       # one layer's input, b s h bf16 values
    terms = checkpoint_terms(4096, 1, 8192, tensor_parallel=8, partition_activations=True)
    assert terms["gathered"] == whole and terms["gpu"] == whole // 8       # "1/*t* on each GPU"
    assert checkpoint_terms(4096, 1, 8192, tensor_parallel=8, partition_activations=True,
                            cpu_checkpointing=True)["gpu"] == 0
    assert checkpoint_terms(4096, 1, 8192, tensor_parallel=8, sequence_parallel=True,
                            partition_activations=True)["gathered"] == 0   # "gathers nothing"
    # 80 layers' checkpoints: P_a saves 7/8 of them.
    assert plain - pa == 80 * (whole - whole // 8)
    says(text, f"one all-gather of {whole / 1e6:.2f} MB",
         f"fall from {gb(plain)} GB to {gb(pa)} GB", f"leaving {gb(cpu)} GB",
         "(DeepSpeed's `partition_activations`)", "(`cpu_checkpointing`)")


_CP: dict = {}


def _cp(seq, engine="fsdp2"):
    """The fastest on 64 H100 at Llama 2's 4M tokens per step, without and with CP up to 8,
    under FSDP2's rules (torchtitan's ring attention beside FSDP); without CP alone under
    another engine."""
    if (seq, engine) not in _CP:
        batch = 4 * 1024 * 1024 // seq
        _CP[seq, engine] = tuple(
            zl.plan(M, 64, 8, "h100-80gb", seq, batch, context_parallel=cps, engine=engine).fits.iloc[0]
            for cps in ((1,), (1, 2, 4, 8)) if engine == "fsdp2" or cps == (1,))
    return _CP[seq, engine]


def test_context_parallel_read(cells):
    text = cells["context-parallel-read"]
    h100 = zl.get_device("h100-80gb")

    def peak(seq, c):
        run = zl.Run.of(M, 64, seq_len=seq, micro_batch=1, recompute="selective", tensor_parallel=8,
                        sequence_parallel=True, context_parallel=c, device=h100.name, stages=(3,))
        return zl.estimate(run).stages[0]["peak"]

    # CP over C keeps s/C tokens: 131,072 tokens over 8 are 16,384 tokens' activations.
    assert peak(131072, 8) == peak(16384, 1) and peak(131072, 1) > h100.capacity >= peak(131072, 8)
    tp8, cp8 = _cp(8192)
    tp32, cp32 = _cp(32768)
    tp128, cp128 = _cp(131072)
    assert tp128["recompute"] == "full" and cp128["recompute"] == "none"
    assert cp128["context_parallel"] == 8 and cp8["tensor_parallel"] == 1 and cp8["context_parallel"] > 1
    for tp, cp in ((tp8, cp8), (tp32, cp32), (tp128, cp128)):
        assert cp["step_seconds"] < tp["step_seconds"]
    says(text, f"At 8,192 tokens *t* 8 + SP peaks at {gb(peak(8192, 1))} GB; at 131,072 at {gb(peak(131072, 1))} GB",
         f"only full recomputation fits ({describe_configuration(tp128)}, {tp128['step_seconds']:.1f} s)",
         f"({gb(peak(131072, 8))} GB at 131,072 tokens)",
         f"recomputation: {describe_configuration(cp128)}, {cp128['step_seconds']:.1f} s, "
         f"{tp128['step_seconds'] / cp128['step_seconds']:.2f} times faster",
         f"it gains {tp32['step_seconds'] / cp32['step_seconds']:.2f} times "
         f"({tp32['step_seconds']:.1f} s to {cp32['step_seconds']:.1f} s)",
         f"parallelism: {describe_configuration(cp8)}, {cp8['step_seconds']:.1f} s against {tp8['step_seconds']:.1f} s",
         "zerolib times those sends as fully exposed, so CP's cost here is an upper bound")
    # "Without CP FSDP2's fastest are DeepSpeed's, at the same step times: every one is ZeRO-3".
    for seq, tp in ((8192, tp8), (32768, tp32), (131072, tp128)):
        (deepspeed,) = _cp(seq, "deepspeed")
        assert tp["stage"] == deepspeed["stage"] == 3
        assert describe_configuration(tp) == describe_configuration(deepspeed)
        assert tp["step_seconds"] == deepspeed["step_seconds"]
    says(text, "Without CP FSDP2's fastest are DeepSpeed's, at the same step times: every one is ZeRO-3")
    assert zl.get_model(M).kv_heads == 8       # "8 key/value heads cap it at 8"
    says(cells["context-parallel-intro"], "8 key/value heads cap it at 8", "in 2*c* chunks",
         "ZeRO shards over the *d* × *c* GPUs", "(the tables write *c* as \"C\")",
         "both under PyTorch FSDP2's rules (`engine=\"fsdp2\"`",
         "the planner refuses *c* > 1 under it")
    with pytest.raises(ValueError, match="context_parallel must be \\(1,\\) for engine deepspeed"):
        zl.plan(M, 64, 8, "h100-80gb", 8192, 512, context_parallel=(1, 2, 4, 8))


def test_the_pages_section_links_land_on_headings_here():
    """The engineer's page links its plan and what the plan leaves out to this notebook's headings."""
    from zerolib.app.answers import SECTIONS
    nb = nbformat.read(NOTEBOOK, as_version=4)
    headings = {line.lstrip("#").strip() for c in nb.cells if c.cell_type == "markdown"
                for line in c.source.splitlines() if line.startswith("## ")}
    for part in ("plan", "left_out"):
        notebook, heading = SECTIONS[part]
        assert notebook == NOTEBOOK.name and heading in headings, part


# Moved from notebook 5 for the main path's hour: how much "hidden" depends on the overlap rule.
def test_the_overlap_rule_as_a_sensitivity(cells):
    said = cells["sensitivity-read"]
    frame = pd_frame = pd.concat([zl.overlap_frame("llama-2-7b", 64, "dgx-h100", "h100-80gb", engine=e)
                                  for e in ("paper", "deepspeed")])
    step = pd_frame.set_index(["engine", "overlap", "stage"])["step_seconds"]
    compute = float(frame["compute_seconds"].iloc[0])
    assert step["paper", "engine", 3] == compute
    assert f"stage 3 costs no time here ({compute:.3f} s, the compute)" in said
    assert (f"first layer's gather exposed it takes {step['paper', 'first gather exposed', 3]:.3f} s, "
            f"with every call's latency charged {step['paper', 'latency charged', 3]:.3f} s, and with "
            f"nothing hidden {step['paper', 'nothing hidden', 3]:.3f} s") in said
    assert step["paper", "post-step gather hidden", 1] == compute
    assert (f"brings them from {step['paper', 'engine', 1]:.3f} s to "
            f"{step['paper', 'post-step gather hidden', 1]:.3f} s") in said
    assert (f"stages 0-2 hide nothing: {step['deepspeed', 'engine', 0]:.3f} s and "
            f"{step['deepspeed', 'engine', 1]:.3f} s") in said
    exposed = pd_frame.set_index(["engine", "overlap", "stage"])
    for stage in (0, 1, 2):     # "hide nothing": all of their communication is exposed
        row = exposed.loc[("deepspeed", "engine", stage)]
        assert row["exposed_seconds"] == row["communication_seconds"] > 0


def test_published_runs_read(cells):
    """The figure's prose: how many runs, how many within the 20 % band, the median ratio, the
    fitted efficiency per device and the runs outside the band, as the table zerolib draws."""
    from zerolib.crosscheck.trained import throughput_table

    table = throughput_table()
    ratio = table["ratio"]
    inside = ((ratio >= 0.8) & (ratio <= 1.2)).sum()
    fitted = table.attrs["fitted"]
    counts = table.groupby("device").size()
    says(cells["published-intro"], f"the throughput {len(table)} published training runs measured")
    text = cells["published-read"]
    says(text, f"{inside} of the {len(table)} runs are predicted within 20 %",
         f"the median ratio {ratio.median():.2f}",
         f"efficiencies of {fitted['a100-80gb']} on the A100 ({counts['a100-80gb']} runs) and "
         f"{fitted['h100-80gb']} on the H100 ({counts['h100-80gb']} runs)")
    slow = table[ratio < 0.8]["run"].tolist()
    fast = table[ratio > 1.2]["run"].tolist()
    says(text, f"Outside the band: {' and '.join(slow)}, predicted slower than they ran, and "
               f"{' and '.join(fast)}, faster")
    assert set(table["device"]) == {"a100-80gb", "h100-80gb"}
    # "not a utilisation": above the 38-43 % Llama 3 measured (arXiv:2407.21783, Table 4)
    assert fitted["h100-80gb"] > 0.43
    from zerolib.core.defaults import DEFAULT_MFU
    says(text, f"so the default stays {DEFAULT_MFU}")
    says(cells["summary"], f"predicts {inside} of {len(table)} published runs within 20 %")
