"""The planner's figure and explorer: the chart draws what the plan holds and updates in place;
the explorer re-plans on every control, redraws the same figure, and its texts say what the plan
says (including that it ranks by a model)."""
import html

import IPython.display
import numpy as np
import pytest

import zerolib as zl
from zerolib.chapter import fast_png
from zerolib.chapter.charts.plan_peaks import (
    FAMILIES,
    draw_plan_peaks,
    plan_peaks_figure,
    plan_titles,
    update_plan_peaks,
)
from zerolib.chapter.explorers.planner import PlannerExplorer, ranking_html, summary_html
from zerolib.chapter.style import add_axes, new_figure
from zerolib.core.planner import PLAN_HEADER, describe_configuration, plan


@pytest.fixture(autouse=True)
def no_display(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("display() called from an explorer")
    monkeypatch.setattr(IPython.display, "display", refuse)


@pytest.fixture(scope="module")
def a100():
    return plan("llama-2-70b", 64, 8, "a100-80gb", 4096, 1024)


def test_the_chart_draws_every_configuration(a100):
    figure, artists = plan_peaks_figure(a100.valid)
    valid = a100.valid
    # Each configuration once: on the frontier in its family's colours, or in the faded rest.
    drawn = {tuple(p) for name in FAMILIES for p in artists.points[name].get_offsets()}
    drawn |= {tuple(p) for p in artists.rest.get_offsets()}
    want = {(s, p / 1e9) for s, p in zip(valid["step_seconds"], valid["peak_bytes"])}
    assert drawn == want
    assert sum(len(artists.points[name].get_offsets()) for name in FAMILIES) \
        + len(artists.rest.get_offsets()) == len(valid)
    # The ring is on the planner's first; the dashed line at the capacity.
    best = a100.fits.iloc[0]
    assert np.allclose(artists.best.get_offsets(), [[best["step_seconds"], best["peak_bytes"] / 1e9]])
    assert artists.device_line.get_ydata()[0] == pytest.approx(85.899345920)
    title, subtitle = plan_titles(valid)
    assert title == "Every runnable configuration of llama-2-70b on 64 A100 80GB"
    assert subtitle.startswith(f"{a100.counts()['fit']:,} of {a100.counts()['runnable']:,} fit")


def test_the_chart_updates_in_place_to_what_a_fresh_draw_gives(a100):
    other = plan("llama-2-13b", 64, 8, "h100-80gb", 2048, 512, shard_groups="whole")
    figure, artists = plan_peaks_figure(a100.valid, dpi=60)
    update_plan_peaks(artists, other.valid, "GiB")
    fresh, _ = plan_peaks_figure(other.valid, "GiB", dpi=60)
    assert fast_png.IncrementalPng(figure).render() == fast_png.IncrementalPng(fresh).render()


def test_offloaded_configurations_are_drawn_at_their_step_time():
    offloaded = plan("llama-2-70b", 8, 8, "a100-80gb", 4096, 64, max_micro_batch=1,
                     host_memory=4 * 2**40)
    valid = offloaded.valid
    assert (valid["offload"] != "none").any() and valid["step_seconds"].notna().all()
    figure = new_figure((9.6, 6.4))
    artists = draw_plan_peaks(add_axes(figure, (0.95, 0.35, 1.45, 0.8)), valid)
    assert sum(len(artists.points[name].get_offsets()) for name in FAMILIES) \
        + len(artists.rest.get_offsets()) == len(valid)
    assert "offload" not in plan_titles(valid)[1]


def test_the_chart_checks_its_frame(a100):
    with pytest.raises(ValueError, match="Plan.valid"):
        plan_peaks_figure(a100.valid.drop(columns=["peak_bytes"]))


def test_summary_and_ranking_say_what_the_plan_says(a100):
    best = a100.fits.iloc[0]
    summary = summary_html(a100, "GB")
    assert f"<b>{a100.counts()['fit']:,} fit</b>" in summary
    assert describe_configuration(best) in summary and html.escape(PLAN_HEADER) in summary
    # 229.3 s, three significant digits: its compute alone, TP 2 x DP 32, is by hand (6 x
    # 68,714,504,192 / 2 multiplied parameters + 3 x 5,368,709,120 / 2 of causal core) x
    # 131,072 tokens per GPU / (0.4 x 312e12) = 225.0 s.
    assert "229 s per step" in summary
    table = ranking_html(a100, "GB")
    assert table.count("<tr><td style='text-align:right'>") >= 8
    for record in a100.rejected.itertuples():
        assert f"{record.configurations:,}" in table
    nothing = plan("llama-3.1-405b", 64, 8, "a100-80gb", 4096, 1024, shard_groups="whole")
    assert "Nothing fits. Closest:" in summary_html(nothing, "GB")


@pytest.fixture
def explorer():
    return PlannerExplorer()


def test_the_explorer_starts_at_the_plan(explorer, a100):
    assert explorer.plan.counts() == a100.counts()
    assert explorer.data.equals(a100.valid)
    first = bytes(explorer.image.value)
    assert first == bytes(PlannerExplorer().image.value)          # deterministic
    assert first == fast_png.IncrementalPng(explorer.figure).render()


@pytest.mark.parametrize("name, value", [
    ("gpus", 128), ("gpus_per_node", 4), ("device", "h100-80gb"), ("links", "dgx-h100"),
    ("seq_len", 8192), ("global_batch", 512), ("mfu", 0.5), ("host_memory", 2**40),
    ("shard_groups", "whole"), ("unit", "GiB"), ("model", "llama-2-13b"), ("engine", "fsdp2"),
    ("context_parallel", 2)])
def test_every_control_re_plans_and_redraws_in_place(explorer, name, value):
    if name == "context_parallel":      # C needs an engine that runs ring attention
        explorer.controls["engine"].value = "megatron"
    figure, image = explorer.figure, bytes(explorer.image.value)
    explorer.controls[name].value = value
    assert explorer.figure is figure and bytes(explorer.image.value) != image
    assert bytes(explorer.image.value) == fast_png.IncrementalPng(explorer.figure).render()
    c = explorer.controls
    want = plan(c["model"].value, c["gpus"].value, c["gpus_per_node"].value, c["device"].value,
                c["seq_len"].value, c["global_batch"].value, links=c["links"].value or None,
                mfu=c["mfu"].value, host_memory=c["host_memory"].value or None,
                host_link=c["host_link"].value, shard_groups=c["shard_groups"].value,
                engine=c["engine"].value,
                context_parallel=(1, 2) if c["context_parallel"].value == 2 else (1,))
    assert explorer.plan.counts() == want.counts()
    assert explorer.status.value == ""


def test_the_host_link_times_offloaded_configurations(explorer):
    explorer.controls["host_memory"].value = 2**40
    before, image = explorer.plan.valid, bytes(explorer.image.value)
    explorer.controls["host_link"].value = "pcie5-x16"
    after = explorer.plan.valid
    assert after.attrs["plan"].host_link.name == "pcie5-x16"
    assert bytes(explorer.image.value) != image
    # PCIe 5.0 moves offload's copies twice as fast: no offloaded step is slower, some are
    # faster; nothing else moves.
    offloaded = (before["offload"] != "none").to_numpy()
    step_before, step_after = before["step_seconds"].to_numpy(), after["step_seconds"].to_numpy()
    assert (step_after[offloaded] <= step_before[offloaded]).all()
    assert (step_after[offloaded] < step_before[offloaded]).any()
    assert (step_after[~offloaded] == step_before[~offloaded]).all()


def test_the_unit_alone_does_not_re_plan(explorer):
    plan_before = explorer.plan
    explorer.controls["unit"].value = "GiB"
    assert explorer.plan is plan_before and "GiB" in explorer.table.value


def test_the_model_menu_is_every_preset_that_plans_at_every_sequence_offered(explorer):
    """The menu follows the catalogue: a preset is offered unless a plan at some sequence the
    slider offers refuses it (each one tried here)."""
    def plans_everywhere(name):
        try:
            for seq in explorer.controls["seq_len"].options:
                plan(name, 8, 8, "a100-80gb", seq[1], 1024, stages=(3,), recompute=("full",),
                     max_micro_batch=1)
        except ValueError:
            return False
        return True

    offered = list(explorer.controls["model"].options)
    assert offered == [name for name in zl.MODELS if plans_everywhere(name)]
    # GPT-2's learned position table ends at 1,024 tokens; the slider goes to 32,768.
    assert "gpt2" not in offered and {"llama-2-70b", "gemma-2-9b", "qwen2.5-7b"} <= set(offered)


def test_bad_starting_values_are_rejected():
    with pytest.raises(ValueError, match="gpus"):
        PlannerExplorer(gpus=48)
    with pytest.raises(ValueError, match="model"):
        PlannerExplorer(model="gpt-5")
    with pytest.raises(ValueError, match="device"):
        PlannerExplorer(device="tpu")
    with pytest.raises(ValueError, match="host_link"):
        PlannerExplorer(host_link="nvlink4")
    with pytest.raises(ValueError, match="context_parallel must be one of 1, 2, 4, 8, got 3"):
        PlannerExplorer(context_parallel=3)
    with pytest.raises(ValueError, match="expert_parallel must be one of all, none, got 'some'"):
        PlannerExplorer(expert_parallel="some")


def test_top_level_names():
    assert zl.PlannerExplorer is PlannerExplorer and zl.plan is plan


def test_the_summary_says_which_engine_the_ranking_is_for(explorer):
    """DeepSpeed 0.19.8 by default, whose pipeline engine takes stages 0-1 only; FSDP2 composes
    every stage it offers (0, 2, 3) with a pipeline, and the plan and its words follow."""
    assert explorer.plan.settings.engine.name == "deepspeed"
    assert ("Ranked for DeepSpeed 0.19.8 (its ZeRO stages 0, 1, 2, 3; beside a pipeline 0, 1; "
            "its overlap rule).") in explorer.summary.value
    assert "pipeline_zero" in set(explorer.plan.rejected["rule"])
    explorer.controls["engine"].value = "fsdp2"
    assert ("Ranked for PyTorch FSDP2 (its ZeRO stages 0, 2, 3; beside a pipeline 0, 2, 3; "
            "its overlap rule).") in explorer.summary.value
    assert "pipeline_zero" not in set(explorer.plan.rejected["rule"])
    fits = explorer.plan.fits
    assert ((fits["pipeline_parallel"] > 1) & (fits["stage"] == 3)).any()



def test_the_context_parallel_control_searches_every_degree_up_to_its_largest(explorer):
    """C = 1 by default (the plan notebook 07 shows); under FSDP2 (torchtitan's ring attention)
    4 searches C = 1, 2 and 4: every configuration once per degree, so three times as many as
    FSDP2's plan without CP, and the summary says so."""
    assert explorer.plan.settings.context_parallel == (1,)
    assert ("Searched no context parallelism (C = 1); a dense model has no experts to spread."
            in explorer.summary.value)
    explorer.controls["engine"].value = "fsdp2"
    assert not explorer.controls["context_parallel"].disabled
    image = bytes(explorer.image.value)
    explorer.controls["context_parallel"].value = 4
    assert explorer.plan.settings.context_parallel == (1, 2, 4)
    alone = plan("llama-2-70b", 64, 8, "a100-80gb", 4096, 1024, engine="fsdp2", context_parallel=(1,))
    assert explorer.plan.counts()["configurations"] == 3 * alone.counts()["configurations"]
    want = plan("llama-2-70b", 64, 8, "a100-80gb", 4096, 1024, context_parallel=(1, 2, 4),
                engine="fsdp2")
    assert explorer.plan.counts() == want.counts()
    assert set(explorer.plan.valid["context_parallel"]) == {1, 2, 4}
    assert "Searched context parallelism C = 1, 2, 4;" in explorer.summary.value
    assert bytes(explorer.image.value) != image
    assert bytes(explorer.image.value) == fast_png.IncrementalPng(explorer.figure).render()
    assert [label for label, _ in explorer.controls["context_parallel"].options] == [
        "1 only", "1, 2", "1, 2, 4", "1, 2, 4, 8"]


def test_the_context_parallel_control_is_for_an_engine_with_ring_attention(explorer):
    """DeepSpeed (the default) and the paper's schedule run no ring attention: the control is
    disabled at "1 only" there, as the expert-parallel one is for a dense model. Moving to such
    an engine with C = 4 sets C back to 1 in one redraw."""
    control = explorer.controls["context_parallel"]
    assert control.disabled and control.value == 1
    for engine, disabled in (("megatron", False), ("paper", True), ("fsdp2", False)):
        explorer.controls["engine"].value = engine
        assert control.disabled == disabled, engine
        assert control.value == 1 and explorer.status.value == ""
    control.value = 4
    assert explorer.plan.settings.context_parallel == (1, 2, 4)
    redraws = explorer.redraws
    explorer.controls["engine"].value = "deepspeed"
    assert explorer.redraws == redraws + 1
    assert control.disabled and control.value == 1
    assert explorer.plan.settings.context_parallel == (1,)
    assert explorer.plan.settings.engine.name == "deepspeed" and explorer.status.value == ""
    assert "Searched no context parallelism (C = 1)" in explorer.summary.value
    # Moving between engines that both run it keeps C, also in one redraw.
    explorer.controls["engine"].value = "megatron"
    control.value = 2
    redraws = explorer.redraws
    explorer.controls["engine"].value = "fsdp2"
    assert explorer.redraws == redraws + 1 and control.value == 2
    assert explorer.plan.settings.context_parallel == (1, 2)


def test_a_start_with_context_parallelism_needs_an_engine_with_it():
    with pytest.raises(ValueError, match="context_parallel must be 1 under engine deepspeed: it runs "
                       "no ring-attention context parallelism \\(the engines that do: fsdp2, megatron, torchtitan\\)"):
        PlannerExplorer(context_parallel=2)
    assert PlannerExplorer(engine="megatron", context_parallel=2).plan.settings.context_parallel == (1, 2)


def test_the_expert_parallel_control_is_for_a_mixture_of_experts(explorer):
    """Mixtral's 8 experts split over E = 1, 2, 4 or 8 GPUs (every divisor, the planner's
    default); E = 1 alone is a quarter of the configurations. A dense model has nothing to
    spread: the control is disabled there."""
    assert explorer.controls["expert_parallel"].disabled
    moe = PlannerExplorer(model="mixtral-8x7b")
    assert not moe.controls["expert_parallel"].disabled
    assert moe.plan.settings.expert_parallel == (1, 2, 4, 8)
    assert ("Searched no context parallelism (C = 1) and expert parallelism E = 1, 2, 4, 8 "
            "(every divisor of its 8 experts).") in moe.summary.value
    assert set(moe.plan.valid["expert_parallel"]) <= {1, 2, 4, 8}
    every = moe.plan.counts()["configurations"]
    image = bytes(moe.image.value)
    moe.controls["expert_parallel"].value = "none"
    assert moe.plan.settings.expert_parallel == (1,)
    assert 4 * moe.plan.counts()["configurations"] == every
    assert "expert_parallel" not in moe.plan.valid.columns      # E = 1: nothing spread
    assert ("Searched no context parallelism (C = 1) and no expert parallelism (E = 1)."
            in moe.summary.value)
    assert bytes(moe.image.value) != image
    moe.controls["engine"].value = "megatron"      # an engine with ring attention
    moe.controls["context_parallel"].value = 2
    assert "Searched context parallelism C = 1, 2 and no expert parallelism" in moe.summary.value
    moe.controls["model"].value = "llama-2-7b"
    assert moe.controls["expert_parallel"].disabled


def test_a_setting_returned_to_is_not_planned_again(explorer, monkeypatch):
    """A slider moved back and forth: each setting is planned once while it is among the last
    PLANS_KEPT (8) settings, and planned again once it has dropped out."""
    from zerolib.chapter.explorers import planner as planner_explorer

    made = []
    monkeypatch.setattr(planner_explorer, "plan",
                        lambda *args, **kwargs: (made.append(args), plan(*args, **kwargs))[1])
    gpus = explorer.controls["gpus"]
    for value in (128, 64, 128, 64, 128):
        gpus.value = value
        assert explorer.plan.settings.gpus == value
        assert bytes(explorer.image.value) == fast_png.IncrementalPng(explorer.figure).render()
    assert len(made) == 1                      # 128 once; 64 was planned when it was built
    assert planner_explorer.PLANS_KEPT == 8
    # Seven settings more (nine in all): 64 GPUs at 4,096 tokens, the least recently used,
    # drops out.
    for seq in (1024, 2048, 8192, 16384, 32768):
        explorer.controls["seq_len"].value = seq
    for value in (256, 512):
        gpus.value = value
    assert len(made) == 8 and len(explorer._plans) == 8
    explorer.controls["seq_len"].value = 4096  # 512 GPUs at 4,096: new
    gpus.value = 64                            # dropped out: planned again
    assert len(made) == 10
    gpus.value = 512                           # at 4,096: still kept
    assert len(made) == 10
    gpus.value = 64
    assert explorer.plan.counts() == plan("llama-2-70b", 64, 8, "a100-80gb", 4096, 1024).counts()


def test_the_host_link_says_why_it_changes_nothing_while_nothing_drawn_offloads():
    """Without the CPU memory per node the planner never reports offloaded state as fitting
    (rule host_unknown), so no configuration drawn offloads and the host link, which times only
    offload's copies, changes nothing: its menu is switched off and says why, as the summary
    does. Given 2 TiB per node, offload configurations are drawn and the menu is live."""
    explorer = PlannerExplorer()
    menu = explorer.controls["host_link"]
    assert set(explorer.plan.valid["offload"]) == {"none"}
    assert menu.disabled and "CPU memory per node is not given" in menu.tooltip
    assert "changes nothing here" in menu.tooltip
    assert html.escape(menu.tooltip) in explorer.summary.value
    image = bytes(explorer.image.value)
    menu.value = [name for name in menu.options if name[1] != menu.value][0][1]
    assert bytes(explorer.image.value) == image          # what the menu says: nothing changes
    explorer.controls["host_memory"].value = 2 * 1024**4
    assert set(explorer.plan.valid["offload"]) > {"none"}
    assert not menu.disabled and menu.tooltip is None
    assert "Host link:" not in explorer.summary.value
