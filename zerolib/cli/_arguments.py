"""Parsing of command-line values shared by several subcommands (one-line ValueErrors)."""
from __future__ import annotations

from zerolib.chapter.figures import MAX_POINTS
from zerolib.core.accounting import LAYOUTS, Layout
from zerolib.core.inputs import MAX_GPUS, check_gpus, check_single, check_stage
from zerolib.core.units import parse_count


def whole_number(text: str, name: str) -> int:
    """``"64"`` -> 64; anything that is not a whole number names the flag."""
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {text!r}") from None


def gpu_count(text: str, name: str) -> int:
    """``--gpus 64``: a positive whole number of GPUs; errors name the flag."""
    return check_single(whole_number(text, name), check_gpus, name)


def stage_number(text: str, name: str = "--stage") -> int:
    """``--stage 2``: 0, 1, 2 or 3; errors name the flag."""
    return check_single(whole_number(text, name), check_stage, name)


def gpu_list(text: str, name: str) -> tuple[int, ...]:
    """``"1-64"``, ``"1,2,4,8"`` or ``"1-8,16,32"`` -> sorted distinct GPU counts."""
    if not text.strip():
        raise ValueError(f"{name} must be GPU counts like 1-64 or 1,2,4,8, got {text!r}")
    counts: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            low_n = int(low)
            high_n = int(high) if dash else low_n
        except ValueError:
            raise ValueError(f"{name} must be GPU counts like 1-64 or 1,2,4,8, got {text!r}") from None
        if low_n < 1 or high_n < low_n or high_n > MAX_GPUS:
            raise ValueError(f"{name} ranges must run upwards from 1 to at most {MAX_GPUS:,}, "
                             f"got {part.strip()!r}")
        if high_n - low_n + 1 + len(counts) > MAX_POINTS:
            raise ValueError(f"{name} must name at most {MAX_POINTS} GPU counts")
        counts.update(range(low_n, high_n + 1))
    return tuple(sorted(counts))


def size_list(text: str, name: str) -> tuple[int, ...]:
    """``"1B,7B,13B"`` -> parameter counts."""
    if not text.strip():
        raise ValueError(f"{name} must be model sizes like 1B,7B,70B, got {text!r}")
    return tuple(parse_count(part, name) for part in text.split(","))


def bytes_triplet(text: str) -> Layout:
    """``--bytes 2,2,12``: a custom layout of parameters, gradients, optimizer widths."""
    parts = text.split(",")
    if len(parts) != 3:
        raise ValueError(f"--bytes must be three numbers PARAMETERS,GRADIENTS,OPTIMIZER like 2,2,12, got {text!r}")
    try:
        widths = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"--bytes must be three numbers like 2,2,12, got {text!r}") from None
    try:  # the layout checks each width; the message gains the flag's name
        return Layout.custom(*widths)
    except ValueError as error:
        raise ValueError(f"--bytes {error}") from None


def add_layout_arguments(parser, default: "str | None") -> None:
    """``--layout NAME | --bytes P,G,O``, mutually exclusive."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--layout", default=default, choices=list(LAYOUTS),
                       help="bytes-per-parameter preset (default: mixed-adam, 2,2,12)")
    group.add_argument("--bytes", metavar="P,G,O",
                       help="custom bytes per parameter for parameters,gradients,optimizer")


def layout_from(args) -> "str | Layout | None":
    """The layout the flags ask for (a preset name, a custom Layout, or None)."""
    return bytes_triplet(args.bytes) if args.bytes else args.layout
