"""Notebook 05 (the price of ZeRO): every number and conclusion its prose states, recomputed
from zerolib (or worked out by hand in a comment) and found in the markdown cell that states it.
"""
from __future__ import annotations

from conftest import documentation_text
from prose_support import markdown_cells

import re
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest

import zerolib as zl
from zerolib.chapter.explorers import StepTimeExplorer
from zerolib.core.catalogue.nodes import bus_bandwidth
from zerolib.core.step.time import step_time
from zerolib.core.step.traffic import flat_traffic, traffic
from zerolib.core.units import format_value

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "05-the-price-of-zero.ipynb"
# What 05 taught and moved out for the main path's hour: its sentences and their tests stay here,
# read from the notebook that now holds them.
APPENDIX_A = "11-appendix-papers-and-other-systems"
BESIDE = "08-zero-beside-model-parallelism"
P7 = 7_000_000_000
LLAMA = "llama-2-7b"


@pytest.fixture(scope="module")
def nb():
    return nbformat.read(NOTEBOOK, as_version=4)


def text(nb, cell_id) -> str:
    """A markdown cell's text with line breaks as spaces (sentences wrap across lines)."""
    (cell,) = [c for c in nb.cells if c.get("id") == cell_id]
    assert cell.cell_type == "markdown"
    return " ".join(cell.source.split())


def gb(n_bytes) -> str:
    return f"{float(n_bytes) / 1e9:.2f} GB"


def seconds(value, digits=2) -> str:
    return f"{float(value):.{digits}f} s"


def test_traffic_per_stage(nb):
    said = text(nb, "traffic-read")
    t = flat_traffic(P7, 64, [0, 1, 2, 3])
    kinds = t.by_kind("sent")
    one_pass = kinds["reduce_scatter"][1]
    assert "109,375,000" in said and -(-P7 // 64) == 109_375_000      # ceil(7e9 / 64)
    assert one_pass == 63 * 109_375_000 * 2
    assert f"63 × 109,375,000 × 2 = {gb(one_pass)}" in said
    assert f"all-reduces (two passes): {gb(kinds['all_reduce'][0])}" in said
    assert f"reduce-scatter {gb(one_pass)} and all-gather {gb(kinds['all_gather'][1])}" in said
    # "the same": stages 1 and 2 send what plain data parallelism sends.
    assert t.total_sent[1] == t.total_sent[2] == t.total_sent[0]
    assert f"the same {gb(t.total_sent[1])}" in said
    assert f"{gb(t.total_sent[3])}, 1.5x" in said and t.total_sent[3] / t.total_sent[0] == 1.5


def test_the_papers_limit(nb):
    said = markdown_cells(APPENDIX_A)["limit-read"]
    assert "The paper counts 2Ψ elements for stages 0-2 and 3Ψ for stage 3" in text(nb, "traffic-read")
    for gpus, digits in ((64, 4), (16384, 4)):
        elements = zl.volume(P7, gpus, [0, 3]).elements
        expected = [f"{v:.{digits}f}".rstrip("0").rstrip(".") + "Ψ" for v in elements / P7]
        assert all(e in said for e in expected), (gpus, expected)
        assert 2 * elements[1] == 3 * elements[0]            # exactly 1.5x
    assert "1.5x the others at every GPU count" in said


@pytest.fixture(scope="module")
def timeline():
    return zl.published_data("step-timeline")


def test_the_timeline(nb, timeline):
    said = text(nb, "timeline-read")
    compute = timeline[timeline["lane"] == "compute"].set_index(["stage", "block"])
    forward = compute.loc[(0, "forward")]
    backward = compute.loc[(0, "backward")]
    ms = lambda row: f"{format_value((row['end_seconds'] - row['start_seconds']) * 1000)} ms"  # noqa: E731
    assert f"forward pass takes {ms(forward)}" in said and f"backward pass {ms(backward)}" in said
    wait = compute.loc[(1, "waiting_after_step")]
    assert f"the GPU waits {ms(wait)}" in said
    assert not any(b.startswith("waiting") for s, b in compute.index if s in (0, 3))  # hidden
    assert "1.5x as much" in said
    assert said.startswith("Under the paper's schedule") and timeline.attrs["engine"].name == "paper"


def test_nvlink_inside_infiniband_across(nb):
    said = markdown_cells(BESIDE)["compare-read"]
    inside = zl.tradeoff_frame(LLAMA, 8, "dgx-h100", "h100-80gb")
    across = zl.tradeoff_frame(LLAMA, 64, "dgx-h100", "h100-80gb")
    port = zl.tradeoff_frame(LLAMA, 64, "ib-ndr", "h100-80gb")
    for frame, words in ((inside, "NVLink's {} GB/s"), (across, "still runs at {} GB/s"),
                         (port, "runs at {} GB/s")):
        assert words.format(f"{frame.attrs['bus_bandwidth'] / 1e9:g}") in said
    # 48 / 370 = 0.1297: "13 % of NVLink's rate"; 8 ports of 48 GB/s = 384 GB/s, over NVLink's 370.
    assert round(100 * port.attrs["bus_bandwidth"] / inside.attrs["bus_bandwidth"]) == 13
    assert "13 % of NVLink's rate" in said and "48 GB/s (384 GB/s together)" in said
    # Inside one DGX H100 an all-reduce runs on NVLink SHARP (NVIDIA/nccl issue #1455: 480 GB/s
    # on 8 GPUs): faster than the ring, and stage 0's time in the table follows it.
    nvls = zl.get_link("nvlink4").nvls_bandwidth(8)
    assert f"NVLink SHARP, at {nvls / 1e9:g} GB/s" in said and nvls == 480e9
    ring = zl.interconnect("dgx-h100", efficiency="ring")
    assert inside["communication_seconds"][0] < zl.tradeoff_frame(
        LLAMA, 8, ring, "h100-80gb")["communication_seconds"][0]
    assert zl.interconnect("dgx-h100").nics * 48e9 == 384e9 > across.attrs["bus_bandwidth"]
    assert said.startswith("Under the paper's schedule") and inside.attrs["engine"].name == "paper"
    # The chapter's compute: the model's (its embedding looked up, its attention core counted).
    forward, backward = zl.compute_seconds(zl.parameter_count(LLAMA), "h100-80gb",
                                           port.attrs["compute"])
    all_reduce = step_time(traffic(LLAMA, 64, 0), "ib-ndr", "h100-80gb").communication_seconds
    assert f"all-reduce takes {seconds(all_reduce)}, longer than the {seconds(backward)} backward" in said
    assert all_reduce > backward
    assert (f"{seconds(port['step_seconds'][0])} under plain data parallelism and "
            f"{seconds(port['step_seconds'][3])} under stage 3 against "
            f"{seconds(forward + backward)} of compute") in said


def test_compute_and_overlap(nb):
    # 05 gives the result and defines "exposed"; appendix A's A.6 works the count out with sources.
    short = text(nb, "overlap")
    assert "0.444 s for Llama-2-7B's 4,096 tokens per GPU on an H100" in short and "**exposed**" in short
    assert "at 40 % of the GPU's peak" in short and "(11-appendix-papers-and-other-systems.ipynb)" in short
    said = markdown_cells(APPENDIX_A)["main-compute"]
    p = zl.parameter_count(LLAMA)
    # By hand: the 32,000 x 4,096 embedding is looked up; the causal core is 4,096 tokens x 32
    # heads x (128 + 128) x 32 layers per token, forward once and backward twice.
    multiplied, core = p - 32_000 * 4096, 4096 * 32 * 256 * 32
    assert (multiplied, core) == (6_607_343_616, 1_073_741_824)
    flops = (6 * multiplied + 3 * core) * 4096
    assert (f"(6 × {multiplied:,} + 3 × {core:,}) × 4,096 = {flops / 1e14:.2f} × 10¹⁴ FLOPs"
            in said)
    assert "the embedding is a lookup" in said and "3 times the causal attention core's forward" in said
    assert zl.get_device("h100-80gb").peak_flops == 989_500_000_000_000 and "989.5 TFLOP/s" in said
    compute = flops / (0.4 * 989.5e12)
    assert f"{seconds(compute, 3)} per step" in said and f"{seconds(compute, 3)} for Llama-2-7B's" in short
    frame = zl.published_data("memory-vs-step-time")
    assert float(frame["compute_seconds"][0]) == pytest.approx(compute, rel=1e-12)


def test_the_trade(nb):
    said = text(nb, "tradeoff-read")
    frame = zl.published_data("memory-vs-step-time")
    memory = frame["memory_bytes"].to_numpy() / 1e9
    device = zl.get_device("h100-80gb")
    assert f"({format_value(memory[0])} GB against the H100's {device.capacity / 1e9:.1f} GB)" in said
    assert memory[0] * 1e9 > device.capacity
    assert f"least memory, {format_value(memory[3])} GB" in said and memory.argmin() == 3
    assert f"{seconds(frame['step_seconds'][3])}, the compute alone" in said
    assert frame["step_seconds"][3] == frame["compute_seconds"][3]
    assert f"Stages 1 and 2 take {seconds(frame['step_seconds'][1])}" in said
    assert f"{frame['network_wait_fraction'][1]:.0%}".replace("%", " %") in said
    # "On a slower network, or under an engine that overlaps less, the price is paid in seconds
    # too": one NDR port per GPU, or DeepSpeed's rule on the same nodes, lengthens every stage.
    assert "On a slower network, or under an engine that overlaps less, the price is paid in seconds too" in said
    slow = zl.tradeoff_frame(LLAMA, 64, "ib-ndr", "h100-80gb")["step_seconds"]
    deepspeed = zl.tradeoff_frame(LLAMA, 64, "dgx-h100", "h100-80gb", engine="deepspeed")["step_seconds"]
    for stage in (1, 2, 3):
        assert slow[stage] > frame["step_seconds"][stage]
    for stage in (1, 2):
        assert deepspeed[stage] > frame["step_seconds"][stage]


def cells(table_html, strategy) -> list[str]:
    start = table_html.index(f"<td>{strategy}</td>")
    return re.findall(r"<td[^>]*>([^<]*)</td>", table_html[start:table_html.index("</tr>", start)])


STAGE_NAMES = {0: "Plain data parallelism", 1: "ZeRO stage 1 (optimizer)",
               2: "ZeRO stage 2 (+ gradients)", 3: "ZeRO stage 3 (+ parameters)"}


def explorer_after(**changes) -> StepTimeExplorer:
    """The notebook's explorer (it starts under the paper's schedule) after ``changes``."""
    explorer = StepTimeExplorer(engine="paper")
    for name, value in changes.items():
        explorer.controls[name].value = value
    return explorer


def table(explorer, stage) -> list[str]:
    return cells(explorer.table.value, STAGE_NAMES[stage])


def pct(cell: str) -> str:
    return cell.replace("%", " %")


def test_things_to_try(nb):
    said = text(nb, "explorer-read")
    assert "the explorer starts under the paper's schedule" in said
    e = explorer_after(link="ib-ndr")
    assert e.data.attrs["bus_bandwidth"] == 48e9 and "falls to 48 GB/s" in said
    rows = {s: table(e, s) for s in range(4)}
    assert (f"Plain data parallelism takes {rows[0][5]} ({pct(rows[0][6])} waiting), stages 1 and "
            f"2 {rows[1][5]} ({pct(rows[1][6])}) and stage 3 {rows[3][5]} ({pct(rows[3][6])})") in said
    assert rows[1][5] == rows[2][5]
    assert "Fastest of them: ZeRO stage 1 (optimizer)" in e.summary.value
    assert "stage 1 is the fastest strategy that fits" in said
    e.controls["engine"].value = "deepspeed"
    assert f"stages 1 and 2 take {table(e, 1)[5]} ({pct(table(e, 1)[6])}), and stage 3 is the fastest" in said
    assert "Fastest of them: ZeRO stage 3 (+ parameters)" in e.summary.value

    e = explorer_after(tokens_per_gpu=16384)
    assert "No strategy&#x27;s peak fits the H100 80GB" in e.summary.value
    assert f"(stage 3 needs {table(e, 3)[1]})" in said
    e.controls["device"].value = "b200-180gb"
    fits = [table(e, s)[2] for s in range(4)]
    assert fits == ["too big", "fits", "fits", "fits"] and "stages 1 to 3 fit again" in said



def test_the_real_runs_in_one_sentence(nb):
    said = text(nb, "engines-intro")
    report = zl.communication_report
    for engine in ("pytorch", "deepspeed"):
        assert report.unexplained(engine)[1:] == (0, 0)
    # The runs differ from the schedules (gloo has no reduce-scatter), each difference named.
    assert ("differ from these schedules in many rows, every difference a named mechanism: "
            "0 bytes unexplained ([Appendix B](12-appendix-real-runs.ipynb))") in said
    assert "(gloo, which has no reduce-scatter)" in said and "exactly what" not in said
    # Stage 0 named per engine: the engines table has a stage 0 for each engine that offers it.
    assert all(0 in e.stages for e in zl.ENGINES.values())
    assert "Stage 0 is each engine's own data parallelism" in said


def test_summary_and_links(nb):
    said = text(nb, "summary")
    t = flat_traffic(P7, 64, [0, 3]).total_sent
    assert f"{gb(t[0])} per step under stages 0-2 and {gb(t[1])}" in said
    assert np.isclose(t[1] / t[0], 1.5) and "stage 3 costs 1.5x" in said
    deepspeed, paper = sent_per_stage("deepspeed"), sent_per_stage("paper")
    assert deepspeed[1] / paper[1] == deepspeed[2] / paper[2] == 1.5
    assert "DeepSpeed 0.19.8's defaults send 1.5x at stages 1 and 2 as well" in said
    # At the rates NCCL reaches: NVLink 4's 370 inside and across (8 x 48 = 384 ports out), 48.
    for link, gpus, bandwidth in (("dgx-h100", 8, 370e9), ("dgx-h100", 64, 370e9), ("ib-ndr", 64, 48e9)):
        assert float(bus_bandwidth(zl.interconnect(link), gpus)) == bandwidth
    assert ("a ring runs at 370 GB/s inside and across DGX H100 nodes and at 48 GB/s with one NDR "
            "port per GPU") in said
    forward, backward = zl.compute_seconds(zl.parameter_count(LLAMA), "h100-80gb")
    nodes = zl.tradeoff_frame(LLAMA, 64, "dgx-h100", "h100-80gb")
    assert nodes["step_seconds"][3] == nodes["compute_seconds"][3] and nodes["exposed_seconds"][3] == 0
    # The compute is the step model's: (6 x 6,607,343,616 + 3 x 1,073,741,824) x 4,096 FLOPs at
    # 40 % of 989.5 TFLOP/s = 0.4436 s, as the overlap cell works out (the figure's compute); not
    # 6 FLOPs for every parameter, embedding included, without the attention core (0.418 s).
    assert round(float(nodes["compute_seconds"][3]), 4) == 0.4436
    assert (f"under the paper's overlap rule, stage 3 costs no time on DGX H100 nodes "
            f"({seconds(nodes['compute_seconds'][3], 3)}, the compute)") in said
    assert f"{float(forward + backward):.3f} s" not in said
    slow = zl.tradeoff_frame(LLAMA, 64, "ib-ndr", "h100-80gb")
    assert f"takes {seconds(slow['step_seconds'][3])} on one port per GPU" in said
    frame = zl.published_data("memory-vs-step-time")
    assert frame["memory_bytes"].to_numpy().argmin() == 3 and "Stage 3 needs the least memory" in said
    # Which stage is fastest depends on the engine: stage 1 under the paper's schedule, stage 3
    # under DeepSpeed's, on one port per GPU (see the table the summary closes).
    fastest = {}
    for name in ("paper", "deepspeed"):
        f = zl.tradeoff_frame(LLAMA, 64, "ib-ndr", "h100-80gb", engine=name)
        fits = f[f["memory_bytes"] <= zl.get_device("h100-80gb").capacity]
        fastest[name] = int(fits.set_index("stage")["step_seconds"].idxmin())
    assert fastest == {"paper": 1, "deepspeed": 3} and "which stage is fastest depends on the engine" in said
    assert "](04-will-it-fit.ipynb)" in said and "](06-when-zero-is-not-enough.ipynb)" in said


def test_the_model_leaves_out_links_where_the_chapter_goes_further(nb):
    said = text(nb, "left-out")
    assert "bar an all-reduce in an H100 node" in said and "(NVLink SHARP)" in said
    assert zl.get_link("nvlink4").nvls and not zl.get_link("ib-ndr").nvls
    assert "[shard groups and offload](07-shard-groups-and-offload.ipynb)" in said
    assert "[ZeRO beside model parallelism](08-zero-beside-model-parallelism.ipynb)" in said


def sent_per_stage(engine, micro_batches=1):
    frame = zl.traffic_frame(P7, 64, zl.get_engine(engine).stages, engine=engine,
                             micro_batches=micro_batches)
    return frame.groupby("stage")["sent_bytes"].sum()


def test_stages_1_and_2_as_each_engine_runs_them(nb):
    said = text(nb, "engines-intro")
    # One ring pass of 7e9 / 64 = 109,375,000 two-byte elements, 63 chunks: 13,781,250,000 B.
    one_pass = 63 * 109_375_000 * 2
    deepspeed, paper = sent_per_stage("deepspeed"), sent_per_stage("paper")
    assert deepspeed[1] == 3 * one_pass == 41_343_750_000 and paper[1] == 2 * one_pass
    assert (f"then all-gathers, so its stage 1 sends {deepspeed[1]:,} B per GPU, not the paper's "
            f"{paper[1]:,}, as much as stage 3") in said
    assert deepspeed[3] == deepspeed[1]
    assert 1 not in zl.get_engine("fsdp2").stages and "PyTorch FSDP2 has no stage 1" in said
    megatron = sent_per_stage("megatron")
    assert megatron[1] == paper[1] and "Megatron-LM's distributed optimizer is stage 1 on the paper's" in said
    assert "DeepSpeed 0.19.8 at its defaults runs stages 1 and 2 otherwise" in said
    assert zl.get_engine("deepspeed").all_reduce_stages == (1, 2)


def test_gradient_accumulations_price(nb):
    said = markdown_cells(BESIDE)["accumulation-traffic-read"]
    one_pass = 63 * 109_375_000 * 2
    for m in (1, 8, 64):
        paper, deepspeed = sent_per_stage("paper", m), sent_per_stage("deepspeed", m)
        # Stages 0-1 synchronise once: 2 passes; stage 2 (m + 1); stage 3 3m; DeepSpeed's stage 2
        # all-reduces every micro-batch: 2m + 1.
        assert paper[0] == paper[1] == 2 * one_pass
        assert paper[2] == (m + 1) * one_pass and paper[3] == 3 * m * one_pass
        assert deepspeed[2] == (2 * m + 1) * one_pass
    assert f"stages 0 and 1 send {gb(2 * one_pass)} whatever *m*" in said
    assert f"stage 2 makes *m* + 1 passes, {gb(9 * one_pass)} at *m* = 8, and stage 3 3*m*, {gb(24 * one_pass)}" in said
    assert f"2*m* + 1 passes: {gb(17 * one_pass)} at *m* = 8" in said


def test_one_engine_table_after_the_overlap_rules(nb):
    """Bytes sent and step time per engine are one table, shown once every engine's overlap rule
    and the step time have been defined."""
    ids = [c.id for c in nb.cells]
    assert "fabric-engines" not in ids and "fabric-engines-intro" not in ids
    assert ids.index("overlap") < ids.index("engines-intro") < ids.index("engines") < ids.index("fabric-engines-read")
    (cell,) = [c for c in nb.cells if c.id == "engines"]
    shown = cell.outputs[0]["data"]["text/html"]
    assert "sent [GB]" in shown and "step, one NDR port per GPU [s]" in shown
    for engine in zl.ENGINES.values():
        assert f"<th>{engine.label}</th>" in shown
    # The paper's row: 27.56 GB at stages 0-2 and 41.34 GB at stage 3 (2 and 3 ring passes of
    # 13,781,250,000 B, the traffic section's by-hand numbers), then its step times on one port.
    paper = zl.tradeoff_frame(LLAMA, 64, "ib-ndr", "h100-80gb", engine="paper").set_index("stage")
    start = shown.index(f"<th>{zl.get_engine('paper').label}</th>")
    row = re.findall(r"<td>([^<]*)</td>", shown[start:shown.index("</tr>", start)])
    assert row[:4] == ["27.56", "27.56", "27.56", "41.34"]
    assert row[4:] == [f"{round(float(paper['step_seconds'][s]), 3):.3f}" for s in range(4)]


def test_the_fastest_that_fits_on_one_port_per_gpu_per_engine(nb):
    said = text(nb, "fabric-engines-read")
    steps = {}
    for name, engine in zl.ENGINES.items():
        frame = zl.tradeoff_frame(LLAMA, 64, "ib-ndr", "h100-80gb", engine=name)
        fits = frame[frame["memory_bytes"] <= zl.get_device("h100-80gb").capacity]
        steps[name] = fits.set_index("stage")["step_seconds"]
        assert frame.set_index("stage")["memory_bytes"][0] > zl.get_device("h100-80gb").capacity

    def fastest(name):
        return int(steps[name].idxmin())
    assert fastest("paper") == 1 and steps["paper"][1] == steps["paper"][2]
    assert f"stage 1 is the fastest that fits ({steps['paper'][1]:.3f} s, stage 2 the same)" in said
    assert fastest("deepspeed") == 3
    assert (f"1 and 2 move 3Ψ and reduce after the backward pass, {steps['deepspeed'][1]:.3f} s, "
            f"and stage 3 is the fastest that fits ({steps['deepspeed'][3]:.3f} s)") in said
    assert fastest("fsdp2") == 2 and f"Under FSDP2 stage 2 is ({steps['fsdp2'][2]:.3f} s" in said
    assert list(steps["megatron"].index) == [1] and f"takes {steps['megatron'][1]:.3f} s at stage 1" in said


def test_the_overlap_rule_comes_before_any_costs_no_time(nb):
    ids = [c.id for c in nb.cells if c.cell_type == "markdown"]
    said = {i: text(nb, i) for i in ids}
    first_rule = ids.index("timeline-intro")
    assert "**overlap rule**" in said["timeline-intro"]
    for i, cell_id in enumerate(ids):
        if re.search(r"costs? no time|all of it hides", said[cell_id]):
            assert i > first_rule, cell_id
            assert re.search(r"under (the paper's|that) (overlap )?rule|under the paper's rule",
                             said[cell_id], re.I), cell_id


def test_achieved_link_rates(nb):
    said = text(nb, "links-intro")
    nvlink, ndr = zl.get_link("nvlink4"), zl.get_link("ib-ndr")
    assert (nvlink.achieved_bandwidth, nvlink.bandwidth) == (370e9, 450e9)
    assert (ndr.achieved_bandwidth, ndr.bandwidth) == (48e9, 50e9)
    assert "about 370 of NVLink 4's 450 GB/s" in said and "48 of an NDR port's 50 GB/s" in said
    assert "#212" in nvlink.achieved_source and "#212" in said and "#267" in said
    # The ring's rate across nodes and on one port per GPU, said here since its table moved to 08:
    # 8 NDR ports of 48 GB/s (384) leave NVLink's 370 the limit; 48 / 370 = 0.1297.
    across = zl.tradeoff_frame(LLAMA, 64, "dgx-h100", "h100-80gb").attrs["bus_bandwidth"]
    port = zl.tradeoff_frame(LLAMA, 64, "ib-ndr", "h100-80gb").attrs["bus_bandwidth"]
    assert (across, port) == (370e9, 48e9) and round(100 * port / across) == 13
    assert "8 NDR ports each, it still runs at 370 GB/s" in said
    assert "(`ib-ndr`), at 48 GB/s, 13 % of NVLink's rate" in said
    assert "[Notebook 8](08-zero-beside-model-parallelism.ipynb) times a step on each" in said


def test_the_figures_say_which_engine(nb):
    assert zl.published_data("step-timeline").attrs["engine"].name == "paper"
    assert zl.published_data("memory-vs-step-time").attrs["engine"].name == "paper"
    assert "The figure follows the ZeRO paper's schedule" in text(nb, "timeline-intro")
    assert "under the ZeRO paper's schedule and overlap rule" in text(nb, "tradeoff-intro")
    (cell,) = [c for c in nb.cells if c.get("id") == "explorer"]
    assert 'engine="paper"' in cell.source


def test_the_readme_tells_05s_lessons():
    readme = documentation_text(flat=True)
    deepspeed, paper = sent_per_stage("deepspeed"), sent_per_stage("paper")
    assert (f"7B on 64 GPUs: {deepspeed[1]:,} bytes per GPU at stage 1, not {paper[1]:,}") in readme
    assert "(m + 1) Psi and 3m Psi under the paper's schedule, while stages 0-1 synchronise once" in readme
    one_pass = 63 * 109_375_000 * 2
    assert sent_per_stage("paper", 5)[2] == 6 * one_pass and sent_per_stage("paper", 5)[3] == 15 * one_pass


def test_the_explorers_engine_menu(nb):
    from zerolib.core.step.engines import DEFAULT_ENGINE
    said = text(nb, "explorer-intro")
    assert "The engine menu defaults to DeepSpeed 0.19.8, as `zerolib estimate` does" in said
    explorer = StepTimeExplorer()
    assert explorer.engine == DEFAULT_ENGINE == "deepspeed"
    assert dict(explorer.controls["engine"].options)["DeepSpeed 0.19.8"] == "deepspeed"
    assert "the paper's schedule, which is its static picture" in said
