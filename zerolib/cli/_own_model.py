"""``--config PATH`` and ``--megatron-args ARGS``: a model of one's own wherever ``--model``
takes a preset."""
from __future__ import annotations

from zerolib.core.catalogue.models import TransformerConfig, get_model

CONFIG_HELP = ("a Hugging Face config.json, a model directory holding one, a local Hub cache "
               "folder (models--ORG--NAME or its snapshots/HASH), or ORG/NAME already in that "
               "cache; read offline, exact count (a decoder zerolib does not read itself is built "
               "by transformers on the meta device: the validate extra)")


def add_arguments(group) -> None:
    """The options naming a model other than a preset, in the group ``--model`` belongs to."""
    group.add_argument("--config", metavar="PATH", help=CONFIG_HELP)
    group.add_argument("--megatron-args", metavar="ARGS",
                       help="a Megatron-LM launch line in one quoted string (\"--num-layers 32 "
                            "--hidden-size 4096 ... --vocab-size 50257 --tensor-model-parallel-size "
                            "2 ...\"), or a file holding it: the model built as Megatron-LM builds "
                            "it (padded vocabulary) and, for estimate and plan, the run its "
                            "parallel, batch, recompute and precision flags describe; flags beside "
                            "it win (docs/trainer-files.md)")


def given(args) -> bool:
    return getattr(args, "config", None) is not None or getattr(args, "megatron_args", None) is not None


def model_from(args) -> TransformerConfig | None:
    """The model the command line names: a preset (``--model``), a config file, or None."""
    if getattr(args, "model", None) is not None:
        return get_model(args.model)
    if getattr(args, "own_model", None) is not None:   # read once per command
        return args.own_model
    if getattr(args, "config", None) is not None:
        # any decoder transformers builds (imported here: the build's module is not needed to start)
        from zerolib.crosscheck.transformers_model import model_from_any_config
        args.own_model = model_from_any_config(args.config)
        return args.own_model
    if getattr(args, "megatron_args", None) is not None:
        # a whole launch line: the model its arguments build (the rest is the run's: --gpus ...)
        from zerolib.core.megatron_launch import read_launch
        args.own_model = read_launch(args.megatron_args).model
        return args.own_model
    return None
