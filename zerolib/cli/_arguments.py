"""Parsing of command-line values shared by several subcommands (one-line ValueErrors)."""
from __future__ import annotations

from ..accounting import CATEGORIES, LAYOUTS, Layout


def whole_number(text: str, name: str) -> int:
    """``"64"`` -> 64; anything that is not a whole number names the flag."""
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {text!r}") from None


def bytes_triplet(text: str) -> Layout:
    """``--bytes 2,2,12``: a custom layout of parameters, gradients, optimizer widths."""
    parts = text.split(",")
    if len(parts) != 3:
        raise ValueError(f"--bytes must be three numbers PARAMETERS,GRADIENTS,OPTIMIZER like 2,2,12, got {text!r}")
    try:
        widths = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"--bytes must be three numbers like 2,2,12, got {text!r}") from None
    for category, width in zip(CATEGORIES, widths):
        if not width >= 0:  # also rejects NaN
            raise ValueError(f"--bytes {category} width must be non-negative, got {width:g}")
    return Layout.custom(*widths)


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
