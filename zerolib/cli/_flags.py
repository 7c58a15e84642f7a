"""The API's argument names in an error message, said as the flags a user typed.

The library's messages name its arguments (``hpz_partition``, ``tensor_parallel``); at the
command line the same message also names the flag (``--hpz``, ``--tensor-parallel``). One
table per subcommand, built from its parser (an option's ``dest`` is its argument's name) plus
the few arguments whose name differs from their flag's; the message itself is left word for
word and the flags follow it, so a message reads the same from the API and the CLI.
"""
from __future__ import annotations

import argparse
import re

# API argument -> flag, where the flag is not the argument's name with dashes.
ALIASES = {"seq_len": "--seq", "hpz_partition": "--hpz", "reserve_bytes": "--reserve",
           "ddp_gradient_as_bucket_view": "--ddp-bucket-view",
           "flash_attention": "--flash/--no-flash", "pipeline_chunks": "--pipeline-chunks"}
# Messages whose whole line a test pins word for word, so they keep their words alone: the
# learned-position limit names seq_len, which reads as --seq.
AS_PINNED = ("seq_len must be at most ",)
# Identifiers with an underscore cannot be English words; single words (gpus, stage, mfu) can.
_IDENTIFIER = re.compile(r"(?<![\w-])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?![\w-])")


def flag_table(parser: argparse.ArgumentParser) -> dict[str, str]:
    """API argument name -> the flag of ``parser`` that sets it."""
    flags = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest not in ("help",):
            flags[action.dest] = longs[0]
    for name, flag in ALIASES.items():
        if flag.split("/")[0] in {f for f in flags.values()}:
            flags[name] = flag
    return flags


def name_flags(message: str, flags: dict[str, str]) -> str:
    """``message`` followed by the flag of each API argument it names (once each, in order);
    an argument whose flag the message already shows is left alone."""
    if message.startswith(AS_PINNED):
        return message
    named = []
    for name in _IDENTIFIER.findall(message):
        flag = flags.get(name)
        if flag is not None and flag not in message and (name, flag) not in named:
            named.append((name, flag))
    if not named:
        return message
    return message + " (" + "; ".join(f"{name} is {flag}" for name, flag in named) + ")"
