"""``zerolib figures``: regenerate the published figures and their data, or check they are current.

The heavy imports (pandas, matplotlib) happen inside :func:`run`, so other subcommands and
``zerolib --help`` do not pay for them.
"""
from __future__ import annotations

import sys
from dataclasses import replace

from zerolib.cli._arguments import (
    add_layout_arguments,
    gpu_count,
    gpu_list,
    layout_from,
    output_folder,
    size_list,
)
from zerolib.cli._output import progress_bar
from zerolib.cli._summaries import SUMMARIES
from zerolib.core.catalogue.devices import DEVICES
from zerolib.core.inputs import MAX_FIGURE_POINTS, MAX_FIGURE_SIZES
from zerolib.core.parse import parse_count
from zerolib.core.units import UNITS


def register(commands) -> None:
    parser = commands.add_parser(
        "figures", help=SUMMARIES["figures"],
        description="Write figures/<name>.png and .svg, data/<name>.csv and data/README.md for "
                    "the chapter's two figures: per-GPU memory against GPU count, and across "
                    "model sizes. Files are replaced atomically; unchanged files are left alone.")
    parser.add_argument("--out", metavar="DIR",
                        help="write DIR/figures and DIR/data (default: the repository's own)")
    parser.add_argument("--check", action="store_true",
                        help="regenerate into a temporary folder and compare; exit 1 naming each "
                             "stale or missing file; writes nothing")
    variant = parser.add_argument_group(
        "variants", "change what the figures show (needs --out, so the published files stay "
                    "the chapter's)")
    variant.add_argument("--params", metavar="COUNT",
                         help="model size of the GPU-count figure (default: 7B)")
    variant.add_argument("--gpus", metavar="LIST",
                         help="GPU counts of the GPU-count figure, e.g. 1-64 or 1,2,4,8, at "
                              f"most {MAX_FIGURE_POINTS:,} (default: 1-64)")
    variant.add_argument("--sizes", metavar="LIST",
                         help="model sizes of the model-size figure, at most "
                              f"{MAX_FIGURE_SIZES} (default: 1B,7B,13B,30B,70B)")
    variant.add_argument("--sizes-gpus", metavar="N",
                         help="GPU count of the model-size figure (default: 64)")
    variant.add_argument("--device", choices=list(DEVICES),
                         help="device whose capacity is the reference line (default: a100-80gb)")
    add_layout_arguments(variant, default=None)
    variant.add_argument("--unit", choices=list(UNITS),
                         help="unit of the figures' axes (default: GB = 10^9 bytes; CSVs are in bytes)")
    parser.set_defaults(func=run)


def options_from(args):
    """The FigureOptions the command line asks for."""
    from zerolib.chapter import figures
    changes = {}
    if args.params is not None:
        changes["params"] = parse_count(args.params, "--params")
    if args.gpus is not None:
        changes["gpus"] = gpu_list(args.gpus, "--gpus")
    if args.sizes is not None:
        changes["model_sizes"] = size_list(args.sizes, "--sizes")
    if args.sizes_gpus is not None:
        changes["model_gpus"] = gpu_count(args.sizes_gpus, "--sizes-gpus")
    if args.device is not None:
        changes["device"] = args.device
    layout = layout_from(args)
    if layout is not None:
        changes["layout"] = layout
    if args.unit is not None:
        changes["unit"] = args.unit
    return replace(figures.DEFAULTS, **changes)


def run(args) -> int:
    from zerolib.chapter import figures
    options = options_from(args)
    if figures.variant(options) and args.out is None:
        raise ValueError("variant figures need --out DIR: the repository's figures/ and data/ "
                         "hold the published defaults")
    root = figures.repo_root() if args.out is None else output_folder(args.out)

    if args.check:
        problems, notes = figures.check(options, root, progress_bar(sys.stderr, "checking"))
        for note in notes:
            print(f"note: {note}")
        for problem in problems:
            print(problem)
        if problems:
            print(f"{len(problems)} file(s) out of date: run `zerolib figures"
                  f"{'' if args.out is None else ' --out ' + args.out}` to regenerate",
                  file=sys.stderr)
            return 1
        print(f"figures and data are up to date under {root}")
        return 0

    files = figures.build(options, progress=progress_bar(sys.stderr, "drawing"))
    for relative, status in figures.write(files, root):
        print(f"{status:9} {root / relative}")
    return 0
