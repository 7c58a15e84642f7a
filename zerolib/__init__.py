"""zerolib: per-GPU training memory under the ZeRO stages, exact to the byte.

Every number and figure of the chapter in ``notebooks/`` comes from here. The package is four
layers, imports pointing down only:

- :mod:`zerolib.core`: the arithmetic (numpy and pandas only);
- :mod:`zerolib.chapter`: the figures, their style and the explorers (matplotlib, ipywidgets);
- :mod:`zerolib.crosscheck`: the ZeRO paper, DeepSpeed's estimator, real PyTorch/DeepSpeed runs;
- :mod:`zerolib.publish`: notebook re-execution and HTML export;

and the command line (:mod:`zerolib.cli`) on top. The names a reader needs are importable from
the top level, loaded on first use (so ``import zerolib`` stays light), and each is the very
object its module defines, however it is imported:

>>> import zerolib as zl
>>> int(zl.model_state(1_000_000_000, 4, 3).total)   # bytes per worker, ZeRO stage 3
4000000000
"""
from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "zerolib.core.units": ("GB", "GiB", "to_unit", "format_bytes", "format_count", "format_value"),
    "zerolib.core.parse": ("parse_count", "parse_whole", "parse_size"),
    "zerolib.core.memory.accounting": ("CATEGORIES", "STAGES", "PARTITIONED", "STRATEGY_NAMES", "LAYOUTS",
                                "Layout", "get_layout", "model_state"),
    "zerolib.core.catalogue.devices": ("DEVICES", "get_device", "capacity_text", "device_at", "CAPACITY_BASES"),
    "zerolib.core.catalogue.links": ("LINKS", "get_link"),
    "zerolib.core.catalogue.nodes": ("NODES", "interconnect", "bus_bandwidth", "ring_latency"),
    "zerolib.core.step.collectives": ("ring_volume", "collective_seconds"),
    "zerolib.core.catalogue.models": ("MODELS", "TransformerConfig", "get_model", "parameter_count",
                            "active_parameter_count", "largest_layer"),
    "zerolib.core.catalogue.hf_config": ("model_from_config",),
    "zerolib.core.catalogue.megatron_args": ("model_from_megatron_args",),
    "zerolib.core.memory.activations": ("layer_activation_bytes", "layer_activation_terms",
                                 "model_activation_terms"),
    "zerolib.core.memory.model_parallel": ("MODULE_SPLITS", "split_table", "parallel_rules", "check_parallel",
                                    "parameters_per_gpu", "largest_module_per_gpu",
                                    "model_state_per_gpu", "stage_layers"),
    "zerolib.core.memory.pipeline_schedule": ("micro_batches_in_flight", "layer_activations_held",
                                       "stage_activation_terms", "activation_bytes_per_gpu"),
    "zerolib.core.step.model_parallel_traffic": ("tensor_parallel_traffic", "pipeline_traffic",
                                            "traffic_frame"),
    "zerolib.core.memory.feasibility": ("model_state_fits", "fewest_gpus", "largest_model"),
    "zerolib.core.memory.working_set": ("WorkingSetSettings", "TERMS", "working_set", "peak", "peaks",
                                 "peak_fits", "fewest_gpus_for_peak", "largest_micro_batch",
                                 "stage_rows"),
    "zerolib.core.memory.placement": ("Placement", "TIERS", "OPTIONS", "place", "offered_stages"),
    "zerolib.core.step.traffic": ("volume", "traffic", "flat_traffic", "layer_units", "SLOTS",
                                  "group_traffic", "GROUP_SLOTS"),
    "zerolib.core.step.time": ("ComputeSettings", "compute_seconds", "step_time", "group_step_time"),
    "zerolib.core.step.offload_traffic": ("host_traffic", "HOST_SLOTS"),
    "zerolib.core.step.tables": ("traffic_frame", "timeline_frame", "tradeoff_frame",
                                 "group_traffic_table"),
    "zerolib.core.memory.tables": ("memory_table", "fewest_gpus_table", "stage_savings", "peak_frame",
                            "divisors", "group_size_table", "tier_table"),
    "zerolib.core.estimate": ("estimate", "estimate_model"),
    "zerolib.core.step.parallel": ("parallel_step_time", "cluster_interconnect", "bubble_fraction",
                                   "shard_group_traffic"),
    "zerolib.core.planner": ("plan", "describe_configuration", "PLAN_HEADER", "PLAN_LEFT_OUT"),
    "zerolib.chapter.style": ("render_png", "render_svg"),
    "zerolib.chapter.figures": ("FigureOptions", "published_figure", "published_data"),
    "zerolib.chapter.charts.gpu_count": ("gpu_count_figure",),
    "zerolib.chapter.charts.model_size": ("model_size_figure",),
    "zerolib.chapter.charts.will_it_fit": ("will_it_fit_figure",),
    "zerolib.chapter.charts.measured": ("measured_vs_predicted_figure",),
    "zerolib.chapter.charts.group_size": ("group_size_figure",),
    "zerolib.chapter.charts.offload_tiers": ("offload_tiers_figure",),
    "zerolib.chapter.charts.conventions": ("conventions_figure",),
    "zerolib.chapter.charts.step_timeline": ("step_timeline_figure",),
    "zerolib.chapter.charts.tradeoff": ("memory_vs_step_time_figure",),
    "zerolib.chapter.charts.group_traffic": ("group_tradeoff_figure",),
    "zerolib.chapter.charts.plan_peaks": ("plan_peaks_figure",),
    "zerolib.chapter.explorers": ("GpuCountExplorer", "ModelSizeExplorer", "WillItFitExplorer",
                                  "PlacementExplorer", "StepTimeExplorer", "PlannerExplorer"),
}
# Whole modules of the cross-checks, used as namespaces (``zl.paper.figure1_comparison()``).
_MODULES = {
    "paper": "zerolib.crosscheck.paper",
    "deepspeed_estimator": "zerolib.crosscheck.deepspeed_estimator",
    "korthikanti": "zerolib.crosscheck.korthikanti",
    "megatron_theoretical_memory": "zerolib.crosscheck.conventions.megatron_theoretical_memory",
    "report": "zerolib.crosscheck.validation.report",
    "megatron_distributed_optimizer": "zerolib.crosscheck.conventions.megatron_distributed_optimizer",
    "playbook": "zerolib.crosscheck.conventions.playbook",
    "zero_infinity": "zerolib.crosscheck.conventions.zero_infinity",
    "side_by_side": "zerolib.crosscheck.conventions.side_by_side",
    "communication_report": "zerolib.crosscheck.validation.comm_report",
    "zeropp": "zerolib.crosscheck.conventions.zeropp",
}
_OWNER = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted([*_OWNER, *_MODULES])


def __getattr__(name):  # PEP 562: import the owning module only when a name is used
    if name in _OWNER:
        value = getattr(import_module(_OWNER[name]), name)
    elif name in _MODULES:
        value = import_module(_MODULES[name])
    else:
        raise AttributeError(f"module 'zerolib' has no attribute {name!r}")
    globals()[name] = value  # later look-ups, and `from zerolib import name`, get the same object
    return value


def __dir__():
    return __all__
