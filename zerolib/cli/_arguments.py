"""Parsing of command-line values shared by several subcommands (one-line ValueErrors).

Every count-like flag goes through :func:`zerolib.core.parse.parse_whole`, so ``--gpus``,
``--seq``, ``--micro-batch`` and the rest accept the same spellings (``64``, ``4,096``, ``1e3``,
``4K``) and fail alike.
"""
from __future__ import annotations

from pathlib import Path

from zerolib.core.inputs import MAX_FIGURE_POINTS, MAX_FIGURE_SIZES, MAX_GPUS, MAX_WIDTH, STAGES, echo
from zerolib.core.memory.accounting import LAYOUTS, Layout
from zerolib.core.parse import parse_count, parse_whole, parse_width


def gpu_count(text: str, name: str) -> int:
    """``--gpus 64``: a positive whole number of GPUs; errors name the flag."""
    return parse_whole(text, name, minimum=1, maximum=MAX_GPUS)


def stage_number(text: str, name: str = "--stage") -> int:
    """``--stage 2``: 0, 1, 2 or 3; errors name the flag."""
    try:
        return parse_whole(text, name, minimum=STAGES[0], maximum=STAGES[-1])
    except (ValueError, TypeError):
        raise ValueError(f"{name} must be 0, 1, 2 or 3, got {echo(text)}") from None


def worker_counts(texts, name: str = "--workers") -> tuple[int, ...]:
    """``--workers 2 4``: process counts for the real runs (checked by the runs' own rule)."""
    from zerolib.crosscheck.validation.setups import MAX_WORKERS, check_workers
    return check_workers([parse_whole(text, name, minimum=2, maximum=MAX_WORKERS)
                          for text in texts])


def gpu_list(text: str, name: str) -> tuple[int, ...]:
    """``"1-64"``, ``"1,2,4,8"`` or ``"1-8,16,32"`` -> sorted distinct GPU counts.

    The number of counts is worked out from the ranges before any list is built, so a range of
    millions is refused at once.
    """
    example = "GPU counts like 1-64 or 1,2,4,8"
    if not text.strip():
        raise ValueError(f"{name} must be {example}, got {echo(text)}")
    ranges = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        low_n = parse_whole(low, name, minimum=1, maximum=MAX_GPUS, example=example)
        high_n = parse_whole(high, name, minimum=1, maximum=MAX_GPUS, example=example) if dash else low_n
        if high_n < low_n:
            raise ValueError(f"{name} ranges must run upwards, got {echo(part.strip())}")
        ranges.append((low_n, high_n))
    if sum(high - low + 1 for low, high in ranges) > MAX_FIGURE_POINTS:
        raise ValueError(f"{name} must name at most {MAX_FIGURE_POINTS} GPU counts, got {echo(text)}")
    return tuple(sorted({n for low, high in ranges for n in range(low, high + 1)}))


def size_list(text: str, name: str) -> tuple[int, ...]:
    """``"1B,7B,13B"`` -> parameter counts (sizes are separated by commas, so no digit groups)."""
    parts = text.split(",")
    if not text.strip() or len(parts) > MAX_FIGURE_SIZES:
        raise ValueError(f"{name} must be up to {MAX_FIGURE_SIZES} model sizes like 1B,7B,70B, got {echo(text)}")
    return tuple(parse_count(part, name) for part in parts)


def bytes_triplet(text: str) -> Layout:
    """``--bytes 2,2,12``: a custom layout of parameters, gradients, optimizer widths."""
    parts = text.split(",")
    example = "three numbers PARAMETERS,GRADIENTS,OPTIMIZER like 2,2,12"
    if len(parts) != 3:
        raise ValueError(f"--bytes must be {example}, got {echo(text)}")
    # Each width parsed exactly (never through float(): 1e-400 is not 0, 1_0 is not 10); the
    # names are the ones the layout's own check uses, after the flag.
    names = ("parameters width of 'parameters'", "gradients width of 'gradients'",
             "optimizer width of 'optimizer state'")
    widths = []
    for part, name in zip(parts, names):
        try:
            widths.append(parse_width(part, name, maximum=MAX_WIDTH))
        except ValueError as error:
            if str(error).startswith(f"{name} must be a number of bytes per parameter like"):
                raise ValueError(f"--bytes must be {example}, got {echo(text)}") from None
            raise ValueError(f"--bytes {error}") from None
    return Layout.custom(*widths)


def add_layout_arguments(parser, default: str | None) -> None:
    """``--layout NAME | --bytes P,G,O``, mutually exclusive."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--layout", default=default, choices=list(LAYOUTS),
                       help="bytes-per-parameter preset (default: mixed-adam, 2,2,12)")
    group.add_argument("--bytes", metavar="P,G,O",
                       help="custom bytes per parameter for parameters,gradients,optimizer")


def layout_from(args) -> str | Layout | None:
    """The layout the flags ask for (a preset name, a custom Layout, or None)."""
    return bytes_triplet(args.bytes) if args.bytes is not None else args.layout


def output_folder(text: str, name: str = "--out") -> Path:
    """A folder to write into: not empty text, not an existing file."""
    if not text.strip():
        raise ValueError(f"{name} must name a folder, got an empty path")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name} must be a folder, got the file {echo(text)}")
    return path


def add_run_arguments(parser, records: str) -> None:
    """``--workers N ...``, ``--record`` and ``--data-dir`` of the commands that run real
    training processes; ``records`` names the files ``--record`` writes."""
    from zerolib.crosscheck.validation.setups import MAX_WORKERS
    parser.add_argument("--workers", nargs="+", default=["2", "4"], metavar="N",
                        help=f"process counts to run, each 2-{MAX_WORKERS} (default: 2 4)")
    parser.add_argument("--record", action="store_true",
                        help=f"also write {records} into the data folder (atomically)")
    parser.add_argument("--data-dir", metavar="DIR",
                        help="folder --record writes to (default: the repository's data/)")
