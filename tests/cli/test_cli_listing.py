"""`zerolib --help` lists the commands from their summaries alone: the same text as the parser
built from every command's module, without importing any of them."""
from __future__ import annotations

import json
import subprocess
import sys

from zerolib.cli import COMMANDS, build_parser


def test_the_listing_is_the_full_parsers_listing():
    assert build_parser(listing=True).format_help() == build_parser().format_help()


def test_the_listing_imports_no_command():
    probe = ("import contextlib, io, json, sys\n"
             "from zerolib.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    try:\n"
             "        main(['--help'])\n"
             "    except SystemExit:\n"
             "        pass\n"
             "print(json.dumps([m for m in sys.modules if m.startswith(('zerolib.cli.', 'zerolib.core.'))]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    imported = json.loads(out)
    assert not [name for name in COMMANDS.values() if name in imported]
    assert not [m for m in imported if m.startswith("zerolib.core.")], imported
