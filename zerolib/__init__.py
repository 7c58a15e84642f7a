"""zerolib: per-GPU training memory under the ZeRO stages, exact to the byte.

Every number and figure of the chapter in ``notebooks/`` comes from here. The package is four
layers, imports pointing down only:

- :mod:`zerolib.core`: the arithmetic (numpy and pandas only);
- :mod:`zerolib.chapter`: the figures, their style and the explorers (matplotlib, ipywidgets);
- :mod:`zerolib.crosscheck`: the ZeRO paper, DeepSpeed's estimator, real PyTorch/DeepSpeed runs;
- :mod:`zerolib.publish`: notebook re-execution and HTML export;

and the command line (:mod:`zerolib.cli`) on top. The names a reader of the chapter and a user
of the API need (``docs/api.md`` lists and explains each) are importable from the top level,
loaded on first use (so ``import zerolib`` stays light), and each is the very object its module
defines, however it is imported; everything else is imported from its module:

>>> import zerolib as zl
>>> int(zl.model_state(1_000_000_000, 4, 3).total)   # bytes per worker, ZeRO stage 3
4000000000
"""
from importlib import import_module

__version__ = "0.1.0"

# One entry per module: (module, the names it lends the top level). A tuple of pairs, not a
# dict, so that nothing merges silently; docs/api.md says what each name is, and a test holds
# that no name is registered twice and that every name there is here.
_EXPORTS = (
    # what a setting costs: the two entry points
    # one description of a run, and its file
    ("zerolib.core.run", ("Run", "Cluster", "Parallelism", "Trainer", "Batch")),
    ("zerolib.core.run_file", ("read_run",)),
    # a trainer's own files read as a run: a Megatron-LM launch line, a DeepSpeed config
    ("zerolib.core.megatron_launch", ("run_from_megatron_args",)),
    ("zerolib.core.deepspeed_config", ("run_from_deepspeed_config",)),
    ("zerolib.core.estimate", ("estimate",)),
    ("zerolib.core.planner", ("plan", "describe_configuration", "PLAN_HEADER", "PLAN_LEFT_OUT")),
    # units and numbers people type
    ("zerolib.core.units", ("GB", "GiB", "format_bytes", "format_count")),
    # the catalogues
    ("zerolib.core.catalogue.models", ("MODELS", "get_model", "parameter_count",
                                       "active_parameter_count", "largest_layer")),
    ("zerolib.core.catalogue.devices", ("DEVICES", "get_device", "device_at")),
    ("zerolib.core.catalogue.links", ("LINKS", "get_link")),
    ("zerolib.core.catalogue.nodes", ("NODES", "interconnect", "cluster_interconnect")),
    # your own model: a config.json or a Megatron-LM launch's arguments
    ("zerolib.core.catalogue.hf_config", ("model_from_config",)),
    ("zerolib.core.catalogue.megatron_args", ("model_from_megatron_args",)),
    ("zerolib.crosscheck.transformers_model", ("model_from_any_config",)),
    ("zerolib.core.catalogue.frameworks", ("framework_table",)),
    # memory: model state, where it lives, the working set, the searches
    ("zerolib.core.memory.accounting", ("CATEGORIES", "STAGES", "PARTITIONED", "STRATEGY_NAMES",
                                        "LAYOUTS", "Layout", "get_layout", "model_state")),
    ("zerolib.core.memory.placement", ("Placement", "place")),
    ("zerolib.core.memory.activations", ("layer_activation_bytes", "model_activation_terms")),
    ("zerolib.core.memory.model_parallel", ("split_table", "parameters_per_gpu")),
    ("zerolib.core.memory.pipeline_schedule", ("activation_bytes_per_gpu",)),
    ("zerolib.core.memory.expert_parallel", ("expert_model_state",)),
    ("zerolib.core.memory.working_set", ("WorkingSetSettings", "working_set", "peak", "peaks",
                                         "fewest_gpus_for_peak", "largest_micro_batch",
                                         "stage_rows")),
    ("zerolib.core.memory.feasibility", ("model_state_fits", "fewest_gpus", "largest_model")),
    ("zerolib.core.memory.tables", ("show_never", "memory_table", "fewest_gpus_table",
                                    "stage_savings", "peak_frame", "group_size_table",
                                    "tier_table")),
    # the step: what it communicates and how long it takes
    ("zerolib.core.step.engines", ("ENGINES", "get_engine")),
    ("zerolib.core.step.traffic", ("volume", "SLOTS")),
    ("zerolib.core.step.time", ("ComputeSettings", "compute_seconds")),
    ("zerolib.core.step.run_cost", ("run_cost",)),
    ("zerolib.core.step.expert_parallel_traffic", ("expert_traffic",)),
    ("zerolib.core.step.tables", ("traffic_frame", "timeline_frame", "tradeoff_frame",
                                  "group_traffic_table", "overlap_frame")),
    ("zerolib.core.step.parallel", ("parallel_step_time",)),
    # the chapter: figures and explorers
    ("zerolib.chapter.style", ("render_png",)),
    ("zerolib.chapter.figures", ("FigureOptions", "published_figure", "published_data")),
    ("zerolib.chapter.charts.will_it_fit", ("will_it_fit_figure",)),
    ("zerolib.core.memory.step_memory", ("step_memory_frame",)),
    ("zerolib.chapter.charts.step_memory", ("step_memory_figure",)),
    ("zerolib.chapter.charts.measured", ("measured_vs_predicted_figure",)),
    ("zerolib.chapter.charts.group_size", ("group_size_figure",)),
    ("zerolib.chapter.charts.offload_tiers", ("offload_tiers_figure",)),
    ("zerolib.chapter.charts.conventions", ("conventions_figure",)),
    ("zerolib.chapter.charts.step_timeline", ("step_timeline_figure",)),
    ("zerolib.chapter.charts.group_traffic", ("group_tradeoff_figure",)),
    ("zerolib.chapter.charts.plan_peaks", ("plan_peaks_figure",)),
    ("zerolib.chapter.explorers", ("GpuCountExplorer", "ModelSizeExplorer", "WillItFitExplorer",
                                   "PlacementExplorer", "StepTimeExplorer", "PlannerExplorer",
                                   "ShardExplorer")),
)
# Whole modules of the cross-checks, used as namespaces (``zl.paper.figure1_comparison()``).
_MODULE_ENTRIES = (
    ("paper", "zerolib.crosscheck.paper"),
    ("deepspeed_estimator", "zerolib.crosscheck.deepspeed_estimator"),
    ("report", "zerolib.crosscheck.validation.report"),
    ("communication_report", "zerolib.crosscheck.validation.comm_report"),
    ("megatron_distributed_optimizer", "zerolib.crosscheck.conventions.megatron_distributed_optimizer"),
    ("playbook", "zerolib.crosscheck.conventions.playbook"),
    ("zero_infinity", "zerolib.crosscheck.conventions.zero_infinity"),
    ("side_by_side", "zerolib.crosscheck.conventions.side_by_side"),
    ("zeropp", "zerolib.crosscheck.conventions.zeropp"),
)


_OWNER = {name: module for module, names in _EXPORTS for name in names}
_MODULES = dict(_MODULE_ENTRIES)
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
