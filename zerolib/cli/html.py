"""``zerolib html``: the chapter as static HTML pages in a build folder (not committed)."""
from __future__ import annotations

from zerolib.cli._arguments import output_folder
from zerolib.cli._summaries import SUMMARIES
from zerolib.paths import NOTEBOOK_DIR


def register(commands) -> None:
    parser = commands.add_parser(
        "html", help=SUMMARIES["html"],
        description="Export the chapter's notebooks, with their recorded outputs, to HTML pages "
                    "(figures embedded, readable offline; each explorer as it was saved) plus an "
                    "index.html of the chapter's contents. Nothing is executed.")
    parser.add_argument("--out", default="build/html", metavar="DIR",
                        help="folder for the pages (default: build/html)")
    parser.add_argument("--notebooks", default=str(NOTEBOOK_DIR), metavar="DIR",
                        help="folder of .ipynb files (default: the chapter's notebooks/)")
    parser.add_argument("--widget-js", metavar="DIR",
                        help="folder with require.js (npm: requirejs) and the dist/ files of "
                             "@jupyter-widgets/html-manager 1.x (embed-amd.js ...), copied beside "
                             "the pages so the saved widgets render offline, their controls "
                             "disabled (docs/reading.md gives the npm commands)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from zerolib.publish.html import (
        export_chapter,  # nbconvert is slow to import: only when asked
    )

    pages = export_chapter(output_folder(args.out), args.notebooks, args.widget_js)
    for page in pages:
        print(page.path)
    print(f"{len(pages)} pages; open {pages[0].path.parent / 'index.html'}")
    return 0
