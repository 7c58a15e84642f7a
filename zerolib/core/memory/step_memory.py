"""One step's memory, moment by moment: what the working-set model holds live on one GPU through
the forward pass layer by layer, the loss, the backward pass layer by layer and the optimizer
step. The peak (:func:`zerolib.core.memory.working_set.peak`) sums its terms as if live at once;
this lays the same terms out in time, each over the moments it lives:

- the persistent model state, the reserve and DDP's buckets (allocated when DDP wraps the model)
  at every moment;
- the activations a layer saves, from its forward to its backward: after the forward of layer k
  of L, k/L of them (the layers save alike; the first stage's extras are spread evenly);
- the logits and the loss from the loss to the backward of the last layer (the logits' gradient
  feeds it);
- the gathered parameters (stage 3) while a pass runs, not at the optimizer step;
- DeepSpeed's reduce bucket during the backward at stages 1-2 (allocated in the backward and
  freed after the reduction, as appendix B measured: data/deepspeed_measured_buffers.csv), at
  every moment at stage 3 (allocated once and kept);
- a staged all-gather bucket (stages 1-2, ``allgather_in_place=False``) at the optimizer step,
  when the updated parameters are gathered.

The highest moment is the backward's first, where every term but the staged all-gather bucket
is live: with DeepSpeed's default in-place all-gather it equals the peak the chapter reports.
The chapter's engines only: an engine with its own memory convention (torchtitan) has its own
moments (:func:`zerolib.core.memory.trainer_peak.judge`)."""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from zerolib.core.catalogue.models import TransformerConfig, get_model
from zerolib.core.inputs import check_gpus, check_single
from zerolib.core.memory.accounting import STAGES, STRATEGY_NAMES, Layout, get_layout
from zerolib.core.memory.trainer_peak import Peak
from zerolib.core.memory.working_set import DEFAULT_SETTINGS, TERMS, WorkingSetSettings, peaks

if TYPE_CHECKING:
    import pandas as pd

PHASES = ("forward", "loss", "backward", "optimizer step")
# When each term is live (see the module doc): at every moment, while activations are saved
# (scaled by the layers saved), from the loss to the last layer's backward, during the passes,
# during the backward, at the optimizer step.
LIFETIMES: Mapping[str, str] = MappingProxyType({
    "model state": "always", "reserve": "always", "ddp_buckets": "always",
    "activations": "saved", "logits_loss": "loss", "gathered_parameters": "passes",
    "reduce_bucket": "backward", "allgather_bucket": "optimizer step",
})
COMPONENTS = ("model state", *TERMS)


def moments(layers: int) -> list[tuple[str, int]]:
    """The step's moments in order: (phase, layer), layers counted from 1, 0 where none."""
    return ([("forward", k) for k in range(1, layers + 1)] + [("loss", 0)]
            + [("backward", k) for k in range(layers, 0, -1)] + [("optimizer step", 0)])


def live_bytes(peak: Peak, component: str, phase: str, layer: int, layers: int) -> int:
    """The bytes of ``component`` (``"model state"`` or a working-set term of ``peak``) live at
    the moment (``phase``, ``layer``) of a step through ``layers`` layers."""
    full = int(peak.persistent["total"]) if component == "model state" else int(peak.working_set[component])
    life = LIFETIMES[component]
    if component == "reduce_bucket" and peak.stage == 3:
        life = "always"
    if life == "always":
        return full
    if life == "saved":
        saved = {"forward": layer, "loss": layers, "backward": layer}.get(phase, 0)
        return full * saved // layers
    if life == "loss":
        return full if phase == "loss" or (phase == "backward" and layer == layers) else 0
    if life == "passes":
        return full if phase != "optimizer step" else 0
    return full if phase == life else 0


def step_memory_frame(model: str | TransformerConfig, gpus, stages=STAGES,
                      settings: WorkingSetSettings = DEFAULT_SETTINGS,
                      layout: str | Layout = "mixed-adam") -> pd.DataFrame:
    """Tidy rows of one GPU's memory through one step, per stage: one row per (stage, moment,
    component), in bytes. Columns: stage, strategy, moment (0, 1, ...), phase, layer, component,
    bytes; ``attrs`` holds the model, settings, layout and each stage's peak (bytes, ``peaks``).
    Summing ``bytes`` at a moment gives what is live then; the largest sum of a stage is its
    peak when nothing but the staged all-gather bucket waits for the optimizer step."""
    import pandas as pd
    config, layout = get_model(model), get_layout(layout)
    gpus = check_single(gpus, check_gpus, "gpus")
    if settings.convention.fsdp:
        raise ValueError(f"settings: engine {settings.engine}'s memory has moments of its own "
                         "(its optimizer step's and its backward's); the step's memory follows "
                         "the chapter's engines (paper, deepspeed, fsdp2, megatron)")
    records, by_stage = [], {}
    steps = moments(config.layers)
    for result in peaks(config, gpus, stages, settings, layout):
        by_stage[result.stage] = int(result.total)
        for index, (phase, layer) in enumerate(steps):
            for component in COMPONENTS:
                records.append((result.stage, STRATEGY_NAMES[result.stage], index, phase, layer,
                                component, live_bytes(result, component, phase, layer, config.layers)))
    frame = pd.DataFrame.from_records(records, columns=["stage", "strategy", "moment", "phase",
                                                        "layer", "component", "bytes"])
    frame["bytes"] = frame["bytes"].astype("int64")
    frame.attrs.update(model=config, settings=settings, layout=layout, peaks=by_stage)
    return frame
