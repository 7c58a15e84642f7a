"""``zerolib`` / ``python -m zerolib``: argparse subcommands that call the library.

Bad input never produces a traceback: argparse errors, the library's ValueError/TypeError and
file-system errors (OSError: a folder where a file must go, a read-only or missing path) become
one line on stderr and exit status 2. Values that start with ``-`` (``--params -inf``) are read
as values, not as unknown flags, and long inputs are shortened when an error repeats them. A
mistyped option or command is named first, with the nearest one (``--parmas``: did you mean
``--params``?), before argparse would complain of something it caused (a required option
missing).
"""
from __future__ import annotations

import argparse
import difflib
import re
import sys
from importlib import import_module

from zerolib.cli._flags import flag_table, name_flags
from zerolib.cli._summaries import SUMMARIES

# The subcommands, in the order `zerolib --help` lists them. Each module is imported when its
# command runs (or when every command's own parser is asked for): one command does not pay for
# the imports of the others (pandas, the planner, the cross-checks), and the listing of
# `zerolib --help` for none of them.
COMMANDS = {name: f"zerolib.cli.{name.replace('-', '_')}" for name in SUMMARIES}
_LONG_WORD = re.compile(r"\S{201,}")


def one_line(message: str) -> str:
    """``message`` on one line, each overlong word (an echoed input) cut to 200 characters."""
    return _LONG_WORD.sub(lambda m: m.group(0)[:197] + "...", " ".join(str(message).split()))


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line and exit status 2."""

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def __getattr__(name):   # PEP 562: SUBCOMMANDS, the modules, imported when asked for
    if name == "SUBCOMMANDS":
        return tuple(import_module(module) for module in COMMANDS.values())
    raise AttributeError(f"module 'zerolib.cli' has no attribute {name!r}")


def build_parser(only: str | None = None, listing: bool = False) -> argparse.ArgumentParser:
    """The ``zerolib`` parser with every subcommand, or with ``only`` that one (what parsing
    a command line that names it needs); with ``listing``, every command by its summary alone
    (what ``zerolib --help`` prints), no command's module imported."""
    parser = OneLineParser(
        prog="zerolib",
        description="Per-GPU training memory under the ZeRO stages: estimates, figures, checks.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    commands.required = True
    for name, module in COMMANDS.items():
        if listing:
            commands.add_parser(name, help=SUMMARIES[name])
        elif only is None or name == only:
            import_module(module).register(commands)
    return parser


def _value_options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string, in every subcommand, that takes exactly one value."""
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _value_options(sub)
        elif action.option_strings and action.nargs is None:
            found.update(action.option_strings)
    return found


def attach_negative_values(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``--params -inf`` -> ``--params=-inf``: argparse would take ``-inf`` for an option."""
    takes_value = _value_options(parser)
    out, index = [], 0
    while index < len(argv):
        token = argv[index]
        following = argv[index + 1] if index + 1 < len(argv) else None
        if (token in takes_value and following is not None and following.startswith("-")
                and following.split("=", 1)[0] not in takes_value and following != "--"
                and not following.startswith("--")):
            out.append(f"{token}={following}")
            index += 2
        else:
            out.append(token)
            index += 1
    return out


def _nearest(word: str, choices) -> str:
    """``': did you mean X?'`` for the choice nearest ``word``, or "" when none is near."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.75)
    return f": did you mean {found[0]}?" if found else ""


def mistyped(argv: list[str], parser: argparse.ArgumentParser) -> str | None:
    """The error for the first word of ``argv`` that is no command, or the first ``--option``
    that is none of its command's (nor an abbreviation argparse takes), with the nearest;
    None when there is none. Values are skipped: a word after an option that takes one."""
    if not argv or argv[0].startswith("-"):
        return None
    if argv[0] not in COMMANDS:
        return (f"zerolib: error: {one_line(repr(argv[0]))} is not a command{_nearest(argv[0], COMMANDS)}"
                f" (zerolib --help lists them)")
    options = _subparser(parser, argv[0])._option_string_actions
    index = 1
    while index < len(argv):
        token = argv[index]
        if token == "--":
            break
        if token.startswith("--"):
            name, has_value = token.split("=", 1)[0], "=" in token
            matches = [option for option in options if option.startswith(name)]
            action = options.get(name) or (options[matches[0]] if len(matches) == 1 else None)
            if action is None and not matches:
                return (f"zerolib {argv[0]}: error: unrecognized argument {one_line(name)}"
                        f"{_nearest(name, [o for o in options if o.startswith('--')])} "
                        f"(zerolib {argv[0]} --help lists its options)")
            if action is not None and action.nargs is None and not has_value:
                index += 1          # its value, whatever it looks like
        index += 1
    return None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The top level takes no option but --help, so a command is the first word or absent.
    named = argv[0] if argv and argv[0] in COMMANDS else None
    if named is not None:
        # Every command computes with numpy. Imported here, before the command's own modules
        # rather than beneath them, a command starts 15-20 ms sooner, about a fifth of numpy's
        # own import (measured whole-process: benchmarks/bench_one_answer.py).
        import_module("numpy")
    parser = build_parser(named, listing=named is None)
    typo = mistyped(argv, parser)
    if typo is not None:
        print(typo, file=sys.stderr)
        return 2
    args = parser.parse_args(attach_negative_values(argv, parser))
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `zerolib ... | head` closed the pipe: not an error of ours
        sys.stderr.close()
        return 0
    except OSError as error:  # the file system refused: name the path, no traceback
        where = f": {error.filename}" if error.filename else ""
        reason = error.strerror or type(error).__name__
        print(f"zerolib {args.command}: error: {one_line(reason + where)}", file=sys.stderr)
        return 2
    except (ValueError, TypeError) as error:   # the API names arguments; add the flags
        message = name_flags(one_line(error), flag_table(_subparser(parser, args.command)))
        print(f"zerolib {args.command}: error: {message}", file=sys.stderr)
        return 2


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise LookupError(command)


def run() -> None:
    sys.exit(main())
