"""Running the command line inside a test: status, standard output and standard error."""
from __future__ import annotations

import json

from zerolib.cli import main


def run(capsys, *argv) -> tuple[int, str, str]:
    """``zerolib ARGV``: its exit status (argparse's usage errors exit from inside main), output
    and errors."""
    try:
        status = main(list(argv))
    except SystemExit as exit_:
        status = exit_.code
    out, err = capsys.readouterr()
    return status, out, err


def estimate_json(capsys, *argv) -> dict:
    """``zerolib estimate ARGV --format json``, which must succeed silently, parsed."""
    status, out, err = run(capsys, "estimate", *argv, "--format", "json")
    assert status == 0 and err == "", err
    return json.loads(out)
