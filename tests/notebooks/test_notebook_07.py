"""Notebook 07's prose: every number and judgement a markdown cell states, recomputed with zerolib.

Each test reads one markdown cell (by id), normalises its whitespace and checks the phrases that
carry numbers against values computed here, so a change in the library that moves a number makes
the sentence fail until the text (and the executed notebook) follow.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import numpy as np
import pytest

import zerolib as zl
from zerolib.core.inputs import MAX_GPUS
from zerolib.core.memory.pipeline_schedule import layer_activations_held
from zerolib.core.planner import PLAN_LEFT_OUT, describe_configuration
from zerolib.core.step.model_parallel_traffic import tensor_parallel_traffic
from zerolib.core.step.parallel import bubble_fraction
from zerolib.core.step.time import attention_core_flops
from zerolib.core.units import format_value

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "07-when-zero-is-not-enough.ipynb"
GB = 10**9
M = "llama-2-70b"
A100 = zl.get_device("a100-80gb")
SELECTIVE = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective")
FULL = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="full")


@pytest.fixture(scope="module")
def cells():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return {c.id: " ".join(c.source.split()) for c in nb.cells if c.cell_type == "markdown"}


@pytest.fixture(scope="module")
def a100_plan():
    return zl.plan(M, 64, 8, "a100-80gb", 4096, 1024)


@pytest.fixture(scope="module")
def h100_plan():
    return zl.plan(M, 64, 8, "h100-80gb", 4096, 1024)


def gb(n_bytes, places=2) -> str:
    return f"{n_bytes / GB:,.{places}f}"


def says(text: str, *phrases: str):
    for phrase in phrases:
        assert phrase in text, f"expected {phrase!r} in: {text[:400]}..."


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def stage3(gpus, settings=SELECTIVE):
    return zl.peak(M, gpus, 3, settings)


def test_title(cells):
    # "they alone are larger than an 80 GB GPU"
    assert stage3(64).working_set["activations"] > A100.capacity
    says(cells["title"], "Llama-2-70B at 4,096 tokens", "64 A100 80GB", "8 DGX H100 nodes")


def test_activations_read(cells):
    text = cells["activations-read"]
    p3, big = stage3(64), stage3(1024)
    says(text, f"model state to {gb(p3.persistent['total'])} GB per GPU",
         f"the peak is still {gb(p3.total)} GB", f"activations alone are "
         f"{gb(p3.working_set['activations'])} GB", f"whole working set {gb(p3.working_set_total)} GB",
         f"A100's {gb(A100.capacity, 1)} GB", f"holds {gb(big.persistent['total'])} GB of state",
         f"still peaks at {gb(big.total)} GB")
    assert p3.working_set_total > A100.capacity and p3.total > 130 * GB
    assert p3.working_set_total == big.working_set_total       # "does not depend on ... GPUs"
    assert not np.any(zl.fewest_gpus_for_peak(M, [0, 1, 2, 3], SELECTIVE, device=A100))


def test_fewest_read(cells):
    text = cells["fewest-read"]
    full64 = stage3(64, FULL)
    fewest = zl.fewest_gpus_for_peak(M, 3, FULL, device=A100)
    assert MAX_GPUS == 2**24            # fewest_gpus_for_peak searches up to it
    says(text, "0 means no GPU count up to 2²⁴ fits",
         f"the activations fall to {gb(full64.working_set['activations'])} GB",
         f"stage 3 fits from {fewest} GPUs", f"({gb(full64.total)} GB on 64)",
         "8 FLOPs per parameter and token instead of 6, a third more compute",
         f"{attention_core_flops(M, 4096) / zl.parameter_count(M):.2f} more per parameter and token")
    assert zl.ComputeSettings(1, 0.4, "full").flops_per_param_token == 8
    assert zl.ComputeSettings(1, 0.4).flops_per_param_token == 6


def test_divide_intro(cells):
    text = cells["divide-intro"]
    says(text, "*L* layers' worth, whatever *p*", "twice per layer")
    # The first stage keeps p micro-batches of L/p layers: L layers' worth.
    for p in (2, 4, 8, 16, 80):
        assert int(layer_activations_held(80, p, 0)) == 80
    rows = tensor_parallel_traffic(M, 4096, 1, 8, 1, 0, micro_batches=1)
    forward = [r for r in rows if r.collective == "all-reduce" and r.phase == "forward"
               and "attention and MLP" in r.what]
    assert forward[0].calls == 2 * 80


def acts(t, p, sp, r):
    return int(zl.activation_bytes_per_gpu(M, 4096, 1, t, p, pipeline_stage=r, sequence_parallel=sp,
                                           recompute="selective", flash_attention=True))


def test_divide_read(cells):
    text = cells["divide-read"]
    one, t8 = int(zl.parameters_per_gpu(M, 1, 1)), int(zl.parameters_per_gpu(M, 8, 1))
    p8 = int(zl.parameters_per_gpu(M, 1, 8))
    says(text, f"({one / 1e9:.2f} to {t8 / 1e9:.2f} billion per GPU)",
         f"from {gb(acts(1, 1, False, 0))} to {gb(acts(8, 1, False, 0))} GB",
         f"divides that part too: {gb(acts(8, 1, True, 0))} GB",
         f"({p8 / 1e9:.2f} billion on the heaviest stage)",
         f"first stage still keeps {gb(acts(1, 8, False, 0))} GB",
         f"keeps {gb(acts(1, 8, False, 7))} GB", f"leave {gb(acts(8, 8, True, 0))} GB")
    assert 7.5 < one / p8 < 8.0     # "by about 8"


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


def test_time_intro(cells):
    says(cells["time-intro"], "1,024 sequences of 4,096 tokens (Llama 2's 4M tokens)", "40% of peak")
    assert 1024 * 4096 == 4_194_304   # "4M tokens" (Touvron et al., Table 1)
    assert bubble_fraction(8, 16) == 7 / 16


def test_time_read(cells):
    text = cells["time-read"]
    full, t8, p8, p16 = (timed(c) for c in ("full", "t8", "p8", "p8_16"))
    says(text, f"costs {float(full.parts['compute']):.1f} s of compute",
         f"need about {float(t8.parts['compute']):.0f} s",
         f"spends {float(t8.parts['tensor']):.1f} s per step in its collectives, "
         f"{float(t8.network_wait_fraction):.1%} of the step",
         f"idles {float(p8.parts['bubble']):.2f} s in its bubble, {float(p8.bubble_fraction):.2%}",
         f"the same {float(p16.parts['bubble']):.2f} s are {float(p16.bubble_fraction):.0%} of the step",
         "= 7/23")
    assert float(full.network_wait_fraction) == 0                    # "hides behind that compute"
    assert float(p8.parts["bubble"]) == pytest.approx(float(p16.parts["bubble"]))
    assert float(p16.bubble_fraction) == pytest.approx(7 / 23)


def test_planner_intro(cells):
    says(cells["planner-intro"], "micro-batch 1 to 8", "the ring of its *G* GPUs",
         "the all-reduce among its *d*/*G* replicas once per step", "PCIe 4.0 x16 unless told")
    settings = zl.plan(M, 8, 8, "a100-80gb", 4096, 64).settings
    assert settings.max_micro_batch == 8 and settings.host_link.label == "PCIe 4.0 x16"
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
         f"reject {rules['interleaved_layers'].configurations + rules['schedule'].configurations:,}",
         f"{rules['global_batch'].configurations:,} cannot cut",
         f"{rules['pipeline_zero'].configurations:,} put ZeRO-2",
         f"{rules['host_unknown'].configurations:,} offload to CPU memory",
         f"{rules['capacity'].configurations:,} peak above", f"closest at {gb(rules['capacity'].example_bytes)} GB")
    assert set(rules) == {"kv_heads", "interleaved_layers", "schedule", "global_batch",
                          "pipeline_zero", "host_unknown", "capacity"}
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
    assert small["step_seconds"] == whole["step_seconds"] and small["peak_bytes"] > whole["peak_bytes"]
    says(text, f"A smaller shard group first appears at rank {int(small['rank'])}",
         f"only adds memory ({gb(small['peak_bytes'])} GB against {gb(whole['peak_bytes'])} GB)")


def test_figure_read(cells, a100_plan):
    text = cells["figure-read"]
    says(text, "a third slower", "only in the right band", "spread to the right")
    valid = a100_plan.valid
    plain = valid[(valid["tensor_parallel"] == 1) & (valid["pipeline_parallel"] == 1)]
    assert set(plain[plain["fits"]]["recompute"]) == {"full"}
    # The slowest configurations are pipelines: everything beyond the slowest without one.
    beyond = valid["step_seconds"] > valid[valid["pipeline_parallel"] == 1]["step_seconds"].max()
    assert beyond.any() and (valid[beyond]["pipeline_parallel"] > 1).all()


def test_h100_read(cells, a100_plan, h100_plan):
    text = cells["h100-read"]
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
         f"grows from {a['network_wait_fraction']:.1%} to {h['network_wait_fraction']:.1%}",
         f"ranks {ordinal(int(plain.iloc[0]['rank']))} at {plain.iloc[0]['step_seconds']:.1f} s")
    assert h["network_wait_fraction"] > a["network_wait_fraction"]


def test_honesty_read(cells):
    text = cells["honesty-read"]
    says(text, "never reports a configuration as fitting when a term of its peak is unknown",
         "NVMe, whose capacity is not judged, is not planned",
         "timed on their PCIe copies but not on the CPU's optimizer step")
    blind = zl.plan(M, 8, 8, "a100-80gb", 4096, 64, max_micro_batch=1)
    assert (blind.fits["offload"] == "none").all()
    known = zl.plan(M, 8, 8, "a100-80gb", 4096, 64, max_micro_batch=1, host_memory=4 * 2**40)
    assert (known.fits["offload"] != "none").any() and known.fits["step_seconds"].notna().all()
    assert "nvme" not in " ".join(map(str, zl.plan(M, 8, 8, "a100-80gb", 4096, 64).settings.offload))
    assert any("NVMe" in line for line in PLAN_LEFT_OUT)
    # The CPU's optimizer step is timed now (issue 22, item 5): only the GPU's is left out.
    assert any("CPU's step is timed" in line for line in PLAN_LEFT_OUT)


def test_explorer_intro(cells):
    says(cells["explorer-intro"], 'It starts on "G = d", shard groups of all the data-parallel GPUs only',
         'the figure above without the smaller groups, which "every G" brings back')
    assert zl.PlannerExplorer().plan.settings.shard_groups == "all"      # the class's default
    e = zl.PlannerExplorer(shard_groups="whole")
    every = zl.plan(M, 64, 8, "a100-80gb", 4096, 1024).valid
    whole = every[every["shard_group"] == every["data_parallel"]]
    assert len(e.plan.valid) == len(whole) < len(every)
    assert e.plan.valid["peak_bytes"].tolist() == whole["peak_bytes"].tolist()


def _fastest(explorer):
    return explorer.plan.fits.iloc[0]


def test_explorer_things_to_try(cells):
    """Each 'thing to try', done on the explorer the notebook starts, shows what it predicts."""
    text = cells["explorer-read"]

    def explorer(**changes):
        e = zl.PlannerExplorer(model=M, gpus=64, gpus_per_node=8, device="a100-80gb",
                               shard_groups="whole")
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
    assert (small["tensor_parallel"], small["pipeline_parallel"]) == (1, 1)
    says(text, f"plain data parallelism comes first, {describe_configuration(small)}, "
               f"{format_value(small['step_seconds'])} s, with {small['network_wait_fraction']:.0%}")
    e = explorer(model="llama-3.1-405b")
    assert e.plan.counts()["fit"] == 0
    says(text, f"({e.plan.counts()['runnable']:,} configurations can run, none under the line)")
    e = explorer(host_memory=2**40)
    fits = e.plan.fits
    offloaded = fits[fits["offload"] != "none"]
    top = _fastest(e)
    kept = fits[fits["offload"] == "none"].iloc[0]
    assert describe_configuration(kept) == describe_configuration(first)
    assert top["offload"] == "optimizer+parameters" and not top["sequence_parallel"]
    assert top["tensor_seconds"] < first["tensor_seconds"]            # "fewer tensor-parallel calls"
    assert top["data_parallel_seconds"] == 0                          # "its PCIe copies hide"
    per_gpu = -(-int(zl.parameters_per_gpu(M, top["tensor_parallel"], 1)) // int(top["shard_group"]))
    says(text, f"{len(offloaded):,} offloaded configurations now fit too, and one comes first: "
               f"{describe_configuration(top)}, {format_value(top['step_seconds'])} s",
         f"Its whole lead is {first['step_seconds'] - top['step_seconds']:.2f} s",
         f"Adam over {8 * per_gpu / 1e9:.2f} billion parameters every step")
    faster = explorer(host_memory=2**40, host_link="pcie5-x16")
    assert describe_configuration(_fastest(faster)) == describe_configuration(top)
    assert _fastest(faster)["step_seconds"] == top["step_seconds"]    # "does not move"
    alone, quicker = (x.plan.fits[x.plan.fits["offload"] == "optimizer"].iloc[0] for x in (e, faster))
    assert describe_configuration(alone) == describe_configuration(quicker)
    assert alone["rank"] == quicker["rank"]
    says(text, f"Offloading the optimizer alone (rank {int(alone['rank'])})",
         f"gains {alone['step_seconds'] - quicker['step_seconds']:.2f} s")


def test_summary(cells, a100_plan, h100_plan):
    text = cells["summary"]
    p3 = stage3(64)
    c = a100_plan.counts()
    a, h = a100_plan.fits.iloc[0], h100_plan.fits.iloc[0]
    says(text, f"peaks at {gb(p3.total)} GB per GPU under stage 3", f"alone is {gb(p3.working_set_total)} GB",
         f"fits from {zl.fewest_gpus_for_peak(M, 3, FULL, device=A100)} GPUs",
         f"({gb(acts(1, 8, False, 0))} GB with 8 stages against {gb(acts(1, 1, False, 0))} GB with one)",
         f"{c['fit']:,} of {c['configurations']:,} fit",
         f"fastest by its model is {describe_configuration(a)}, {a['step_seconds']:.1f} s per step",
         f"the same configuration, {h['step_seconds']:.1f} s",
         "(06-sharding-groups-and-offload.ipynb)", "(09-appendix-checking-the-arithmetic.ipynb)")
