"""``zerolib notebooks``: re-execute the chapter's notebooks deterministically, or check them."""
from __future__ import annotations

import sys
from pathlib import Path

from zerolib.cli._summaries import SUMMARIES


def register(commands) -> None:
    parser = commands.add_parser(
        "notebooks", help=SUMMARIES["notebooks"],
        description="Execute each notebook top to bottom in a fresh kernel and save it with its "
                    "outputs and widget state, without timing metadata, with stable widget ids "
                    "and the metadata JupyterLab writes on saving, so a rerun gives the same bytes "
                    "and opening a notebook in JupyterLab rewrites nothing.")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="notebooks to run: a number (01), a name (01-bytes-per-parameter) "
                             "or a path; default: every notebook")
    parser.add_argument("--check", action="store_true",
                        help="re-execute in memory and list the notebooks that would change "
                             "in substance: sources, outputs, figures, widget state, metadata, "
                             "not an editor's view state or kernel display name (exit 1 if any); "
                             "nothing is written")
    parser.add_argument("--dir", default=None, metavar="DIR",
                        help="folder of the notebooks (default: the repository's notebooks/)")
    parser.add_argument("--timeout", type=int, default=600, metavar="SECONDS",
                        help="per-cell time limit (default: 600)")
    parser.set_defaults(func=run)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def run(args) -> int:
    if args.timeout < 1:
        raise ValueError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    # nbformat and nbclient are slow to import: only when this command runs.
    from nbclient.exceptions import (
        CellExecutionError,
        CellTimeoutError,
        DeadKernelError,
    )

    from zerolib._io import remove_stale_temporaries, stale_temporaries
    from zerolib.publish import notebooks

    # Path("") is ".": an empty --dir must not quietly mean the current folder.
    if args.dir is not None and not args.dir.strip():
        raise ValueError("--dir must name a folder, got an empty path")
    paths = notebooks.find_notebooks(args.names, None if args.dir is None else Path(args.dir))

    stale = []
    for path in paths:
        try:
            if args.check:
                current = notebooks.is_current(path, args.timeout)
                if not current:
                    stale.append(path)
                print(f"{_shown(path)}: {'current' if current else 'STALE'}")
            else:
                changed = notebooks.refresh(path, args.timeout)
                print(f"{_shown(path)}: {'rewritten' if changed else 'unchanged'}")
        except (CellExecutionError, CellTimeoutError, DeadKernelError) as error:
            # The cell's traceback is long; its last line names the error.
            lines = [line for line in str(error).splitlines() if line.strip()]
            reason = next((text for text in reversed(lines) if not text.startswith(("-", " "))), "failed")
            print(f"zerolib notebooks: error: {_shown(path)} failed to execute: {reason}",
                  file=sys.stderr)
            return 1
    if args.check:   # an interrupted run's temporary files, which a reader would not notice
        stale += stale_temporaries(paths[0].parent, recursive=False)
    else:            # so that the advice below holds: a run clears what --check reports
        remove_stale_temporaries(paths[0].parent)
    if stale:
        print(f"zerolib notebooks: {len(stale)} stale: {' '.join(_shown(p) for p in stale)} "
              f"(run `zerolib notebooks` to refresh)", file=sys.stderr)
        return 1
    return 0
