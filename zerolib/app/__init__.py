"""The engineer's page (``zerolib app``): one page that answers "will my model train here, and
how should I lay it out?" from the same functions as ``zerolib estimate`` and ``zerolib plan``.

- :mod:`zerolib.app.settings`: what the page was asked (a frozen dataclass), and its round trip
  through a URL query, so a configuration can be shared and reopened;
- :mod:`zerolib.app.answers`: the one function, :func:`zerolib.app.answers.answers`, that asks
  the core, and the pure text, table and CSV of its answers;
- :mod:`zerolib.app.page`: the ipywidgets page over them (the chapter's charts draw its figures);
- ``engineer.ipynb``: the notebook Voilà serves, which builds the page in one cell.

The room sits above the chapter (it draws with the chapter's charts) and below the command line.
"""
