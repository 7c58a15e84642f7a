"""``zerolib`` / ``python -m zerolib``: argparse subcommands that call the library.

Bad input never produces a traceback: argparse errors and the library's ValueError/TypeError
become one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import sys

from zerolib.cli import estimate, figures, html, models, notebooks, validate

SUBCOMMANDS = (estimate, models, figures, notebooks, html, validate)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line and exit status 2."""

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="zerolib",
        description="Per-GPU training memory under the ZeRO stages: estimates, figures, checks.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    commands.required = True
    for module in SUBCOMMANDS:
        module.register(commands)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `zerolib ... | head` closed the pipe: not an error of ours
        sys.stderr.close()
        return 0
    except (ValueError, TypeError) as error:
        message = " ".join(str(error).split())  # one line, whatever the message held
        print(f"zerolib {args.command}: error: {message}", file=sys.stderr)
        return 2


def run() -> None:
    sys.exit(main())
