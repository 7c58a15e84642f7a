"""Explorer redraw: one control change to an updated PNG, against rebuilding the figure per change.

What ``interact`` does on every change is build a new figure from scratch and render it. The
explorers instead update the artists of one figure in place and re-render it (re-using the
pixels of titles, legends, axis and tick labels whose drawing calls and background are those of
an earlier draw). Both sides here draw the same figure at the same DPI with the same PNG
encoder, from the same sequence of settings, measured alternately in one run so that machine
noise hits both; the figures are medians. The explorers' images kept under their control values
are turned off here (``shown_kept = 0``), so every change draws: the lists return to settings
often, and a kept image would time no redraw (``bench_browser_explorer`` times those moves).
"""
from __future__ import annotations

import itertools
import statistics
import time

from timing import size

from zerolib.chapter import fast_png
from zerolib.chapter.charts import gpu_count as gpu_count_chart
from zerolib.chapter.charts import model_size as model_size_chart
from zerolib.chapter.charts import plan_peaks as plan_peaks_chart
from zerolib.chapter.charts import tradeoff as tradeoff_chart
from zerolib.chapter.charts import will_it_fit as will_it_fit_chart
from zerolib.chapter.explorers import (
    GpuCountExplorer,
    ModelSizeExplorer,
    PlacementExplorer,
    PlannerExplorer,
    StepTimeExplorer,
    WillItFitExplorer,
)
from zerolib.chapter.explorers.placement import explorer_figure as placement_figure
from zerolib.chapter.explorers.planner import NO_HOST_MEMORY, USUAL_NODE
from zerolib.core.catalogue.nodes import interconnect
from zerolib.core.memory.accounting import STAGES
from zerolib.core.memory.tables import memory_table, peak_frame, tier_table
from zerolib.core.step.tables import tradeoff_frame

ROUNDS = size(6, 1)  # passes over each explorer's list of changes


def gpu_count_changes():
    """(control, value) pairs touching every control of the GPU-count explorer."""
    return [("params", 13 * 10**9), ("params", 70 * 10**9), ("gpus", (1, 128)), ("gpus", (2, 64)),
            ("device", "h100-80gb"), ("device", "v100-32gb"), ("unit", "GiB"), ("unit", "GB"),
            ("layout", "fp32-adam"), ("optimizer_bytes", 6.0), ("layout", "mixed-adam"),
            ("params", 7 * 10**9), ("gpus", (1, 64)), ("device", "a100-80gb"),
            ("gradients_bytes", 4.0), ("layout", "mixed-adam")]


def model_size_changes():
    return [("gpus", 8), ("gpus", 128), ("gpus", 1024), ("gpus", 64),
            ("models", (10**9, 7 * 10**9, 70 * 10**9)),
            ("models", (10**9, 7 * 10**9, 13 * 10**9, 30 * 10**9, 70 * 10**9)),
            ("device", "h200-141gb"), ("device", "a100-80gb"), ("unit", "GiB"), ("unit", "GB"),
            ("layout", "adam-8bit"), ("parameters_bytes", 4.0), ("layout", "mixed-adam")]


def will_it_fit_changes():
    """Every control of the will-it-fit explorer; each change moves a bar, a label or the line."""
    return [("gpus", 16), ("gpus", 9), ("micro_batch", 2), ("micro_batch", 1),
            ("seq_len", 8192), ("seq_len", 4096), ("recompute", "none"), ("recompute", "full"),
            ("recompute", "selective"), ("flash_attention", False), ("flash_attention", True),
            ("device", "a100-80gb"), ("device", "h100-80gb"), ("unit", "GiB"), ("unit", "GB"),
            ("model", "llama-3-8b"), ("model", "llama-2-7b"), ("gpus", 8),
            ("engine", "torchtitan"), ("recompute", "op-selective"), ("fp8", True),
            ("compile", True), ("compile", False), ("fp8", False), ("recompute", "selective"),
            ("engine", "paper")]


def placement_changes():
    """Every control of the placement explorer."""
    return [("gpus", 64), ("shard_group", 16), ("shard_group", 64), ("gpus", 8),
            ("params", 405 * 10**9), ("params", 70 * 10**9), ("gpus_per_node", 4),
            ("gpus_per_node", 8), ("device", "h100-80gb"), ("device", "a100-80gb"),
            ("unit", "GiB"), ("unit", "GB")]


def step_time_changes():
    """Every control of the step-time explorer; each change moves a point, a label or the line."""
    return [("gpus", 8), ("gpus", 256), ("gpus", 64), ("link", "ib-ndr"), ("link", "dgx-a100"),
            ("gpus_per_node", 4), ("gpus_per_node", 0), ("link", "dgx-h100"),
            ("tokens_per_gpu", 16384), ("tokens_per_gpu", 4096), ("mfu", 0.6), ("mfu", 0.4),
            ("device", "b200-180gb"), ("device", "h100-80gb"), ("unit", "GiB"), ("unit", "GB"),
            ("model", "llama-3-8b"), ("model", "llama-2-7b")]


def planner_changes():
    """Every control of the planner explorer; each change re-plans and moves points or the line."""
    return [("gpus", 128), ("gpus", 64), ("gpus_per_node", 4), ("gpus_per_node", 8),
            ("device", "h100-80gb"), ("device", "a100-80gb"), ("links", "dgx-h100"),
            ("links", USUAL_NODE), ("seq_len", 8192), ("seq_len", 4096), ("global_batch", 512),
            ("global_batch", 1024), ("mfu", 0.5), ("mfu", 0.4), ("host_memory", 2**40),
            ("host_memory", NO_HOST_MEMORY), ("unit", "GiB"), ("unit", "GB"), ("model", "llama-2-13b"),
            ("model", "llama-2-70b"), ("engine", "torchtitan"), ("fp8", True), ("fp8", False),
            ("engine", "deepspeed")]


def rebuild(explorer, kind):
    """What interact would do: a new figure from scratch for the explorer's current settings."""
    if kind == "gpu_count":
        table = memory_table(explorer.params, explorer.gpus, STAGES, explorer.layout)
        figure, _ = gpu_count_chart.gpu_count_figure(table, explorer.device, explorer.unit,
                                                     dpi=explorer.dpi)
    elif kind == "placement":
        table = tier_table(explorer.params, explorer.gpus, shard_group=explorer.shard_group,
                           gpus_per_node=int(explorer.controls["gpus_per_node"].value))
        figure, _ = placement_figure(table, explorer.device, explorer.unit, dpi=explorer.dpi)
    elif kind == "step_time":
        # The explorer's engine (DeepSpeed by default): its stages, schedule and overlap rule.
        frame = tradeoff_frame(explorer.model, explorer.gpus,
                               interconnect(explorer.link, explorer.gpus_per_node), explorer.device,
                               explorer.settings, explorer.mfu, explorer.layout,
                               engine=explorer.engine)
        figure, _ = tradeoff_chart.memory_vs_step_time_figure(frame, explorer.device,
                                                              explorer.unit, dpi=explorer.dpi)
    elif kind == "planner":
        result = explorer._plan()
        figure, _ = plan_peaks_chart.plan_peaks_figure(result.valid, explorer.unit,
                                                       dpi=explorer.dpi)
    elif kind == "will_it_fit":
        frame = peak_frame(explorer.model, explorer.gpus, STAGES, explorer.settings,
                           explorer.layout)
        figure, _ = will_it_fit_chart.will_it_fit_figure(frame, explorer.device, explorer.unit,
                                                         dpi=explorer.dpi)
    else:
        table = memory_table(explorer.models, explorer.gpus, STAGES, explorer.layout)
        figure, _ = model_size_chart.model_size_figure(table, explorer.device, explorer.unit,
                                                       dpi=explorer.dpi)
    return fast_png.IncrementalPng(figure, []).render()


def measure(explorer, kind, changes):
    """Median seconds per change: (update wall, rebuild wall, update CPU, rebuild CPU, count,
    wall to the new image).

    CPU time of this process is reported too: other programs on a shared machine disturb it
    less than wall time. "To the new image" ends when the image widget takes the new PNG (the
    moment its message leaves for the browser); the texts follow it.
    """
    update_wall, rebuild_wall, update_cpu, rebuild_cpu, to_image = [], [], [], [], []
    figure = explorer.figure
    image_at = []
    explorer.image.observe(lambda _change: image_at.append(time.perf_counter()), names="value")
    for name, value in itertools.chain.from_iterable([changes] * ROUNDS):
        before = bytes(explorer.image.value)
        image_at.clear()
        start, start_cpu = time.perf_counter(), time.process_time()
        explorer.controls[name].value = value      # observe fires synchronously
        after = bytes(explorer.image.value)
        update_wall.append(time.perf_counter() - start)
        update_cpu.append(time.process_time() - start_cpu)
        if image_at:
            to_image.append(image_at[0] - start)
        start, start_cpu = time.perf_counter(), time.process_time()
        rebuilt = rebuild(explorer, kind)
        rebuild_wall.append(time.perf_counter() - start)
        rebuild_cpu.append(time.process_time() - start_cpu)
        assert explorer.figure is figure
        assert after == rebuilt, name               # the same pixels as a figure drawn afresh
        assert after != before or name in REPEATED, name
    median = statistics.median
    return (median(update_wall), median(rebuild_wall), median(update_cpu), median(rebuild_cpu),
            len(update_wall), median(to_image))


# Changes that may leave the picture as it was (setting a slider to the preset's own value).
# Float8's saved amax scalars are a few bytes: a picture may not move a pixel for them.
REPEATED = {"layout", "host_memory", "fp8"}


def main(selected=()):
    for explorer, kind, changes in ((GpuCountExplorer(), "gpu_count", gpu_count_changes()),
                                    (ModelSizeExplorer(), "model_size", model_size_changes()),
                                    (WillItFitExplorer(), "will_it_fit", will_it_fit_changes()),
                                    (PlacementExplorer(gpus=8), "placement", placement_changes()),
                                    (StepTimeExplorer(), "step_time", step_time_changes()),
                                    (PlannerExplorer(), "planner", planner_changes())):
        if selected and kind not in selected:
            continue
        explorer._renderer.shown_kept = 0     # every change draws (see the docstring)
        update, rebuilt, update_cpu, rebuilt_cpu, count, to_image = measure(explorer, kind, changes)
        # The planner re-plans a whole space on every change: its target is the ratio alone.
        target = "<= 0.5x" if kind == "planner" else "<= 0.5x and < 30 ms"
        print(f"explorer_{kind}: {update / rebuilt:.2f}x (one control change to a new PNG in "
              f"{type(explorer).__name__}, median {update * 1000:.1f} ms wall "
              f"({update_cpu * 1000:.1f} ms CPU; {to_image * 1000:.1f} ms to the new image) "
              f"over {count} changes of every control, vs "
              f"rebuilding the figure from scratch per change, median {rebuilt * 1000:.1f} ms "
              f"wall ({rebuilt_cpu * 1000:.1f} ms CPU); target {target})")


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
