"""No public function takes more than 8 parameters: a function is given the nouns it needs
(small frozen dataclasses: a TransformerConfig, ActivationOptions, a Pipeline, a Placement...),
not their fields one by one. Read from the source (an AST walk, like tests/test_layers.py):
every ``def`` whose name does not start with a single underscore (``__init__`` counts; nested
functions and methods too), its positional-only, positional and keyword-only parameters, ``self``
and ``cls`` aside (``*args`` and ``**kwargs`` are not counted)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "zerolib"
MOST = 8


def wide_functions(source: str) -> list[tuple[str, int]]:
    """(qualified name, parameters) of each public function of ``source`` with more than
    :data:`MOST` parameters."""
    found = []

    def visit(node, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{scope}{child.name}"
                if not (child.name.startswith("_") and not child.name.startswith("__")):
                    a = child.args
                    count = sum(p.arg not in ("self", "cls")
                                for p in (*a.posonlyargs, *a.args, *a.kwonlyargs))
                    if count > MOST:
                        found.append((name, count))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{scope}{child.name}.")
            else:
                visit(child, scope)

    visit(ast.parse(source), "")
    return found


def test_no_public_function_takes_more_than_8_parameters():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        found += [f"{relative}: {name} takes {count}"
                  for name, count in wide_functions(path.read_text(encoding="utf-8"))]
    assert found == [], "give these the nouns they need"


def test_no_top_level_function_takes_more_than_8_parameters():
    # what `import zerolib as zl` offers, counted as a caller meets it
    import inspect

    import zerolib
    found = []
    for name in zerolib.__all__:
        value = getattr(zerolib, name)
        if inspect.isfunction(value):
            counted = [p for p in inspect.signature(value).parameters.values()
                       if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            if len(counted) > MOST:
                found.append(f"zl.{name} takes {len(counted)}")
    assert found == []


def test_the_count_sees_methods_keywords_and_dunders_but_not_private_names():
    source = ("class A:\n"
              "    def f(self, a, b, c, d, e, g, h, k, *, i): ...\n"
              "    def __init__(self, a, b, c, d, e, g, h, i, j): ...\n"
              "    @classmethod\n"
              "    def of(cls, a, b, c, d, e, g, h, *args, **kwargs): ...\n"
              "def _kernel(a, b, c, d, e, g, h, i, j): ...\n"
              "def door(a, /, b, c, d, e, g, h, i, *, j): ...\n")
    assert wide_functions(source) == [("A.f", 9), ("A.__init__", 9), ("door", 9)]
