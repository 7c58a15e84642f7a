"""The package's layers hold: every import points down, no two packages import each other, and
the core needs nothing beyond numpy and pandas. Read from the source (an AST walk), so a lazy
import inside a function counts as much as one at the top.

The layers, bottom up: the base (``_io``, ``paths``); ``core/``, itself in floors: the shared
basics (``parse``, ``units``, ``inputs``, ``intmath``), the catalogue (models, devices, links,
nodes: facts with sources), the memory arithmetic (bytes per GPU: layouts and accounting,
placement, activations, model-parallel splits, the pipeline schedule, working set, feasibility,
tables), the step (seconds per step: collectives, the data-parallel schedule and its timing,
offload's and model parallelism's traffic, the 3-D step time, tables), then the two entry points
(``estimate``, ``planner``) beside the run and its readers; ``chapter/`` (style and the PNG
renderer, charts, the published figures, explorers); ``crosscheck/``; ``publish/``; ``app/``
(the engineer's page: above the chapter, whose charts draw its figures); ``cli/``. Memory never imports the step.
Private names between modules: ``tests/test_names.py``."""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "zerolib"

# Rank of each part of the package (the longest prefix that matches a module decides): a module
# may import only parts of a rank at most its own. Within one part modules may import each
# other; two parts may not import each other.
RANKS = (
    ("zerolib._io", 0), ("zerolib.paths", 0),
    # the core's shared basics, then its three rooms, then the two entry points on top
    ("zerolib.core", 1),
    ("zerolib.core.catalogue", 2),
    ("zerolib.core.memory", 3),
    ("zerolib.core.step", 4),
    ("zerolib.core.run", 5), ("zerolib.core.run_file", 5),
    # the readers of trainers' own files (a launch line, a DeepSpeed config): runs
    ("zerolib.core.megatron_launch", 5), ("zerolib.core.deepspeed_config", 5),
    ("zerolib.core.estimate", 5), ("zerolib.core.plan_settings", 5), ("zerolib.core.planner", 5),
    ("zerolib.core.plan_table", 5), ("zerolib.core.plan_peaks", 5),
    ("zerolib.chapter", 6), ("zerolib.chapter.style", 6), ("zerolib.chapter.fast_png", 6),
    ("zerolib.chapter.charts", 7),
    ("zerolib.chapter.figures", 8),
    ("zerolib.chapter.explorers", 9),
    ("zerolib.crosscheck", 10),
    ("zerolib.publish", 11),
    ("zerolib.app", 12),
    ("zerolib.cli", 13),
    ("zerolib.__main__", 14),
)
# Third-party packages each layer may use (besides the standard library and zerolib).
ALLOWED = {
    "zerolib._io": set(), "zerolib.paths": set(),
    "zerolib.core": {"numpy", "pandas", "tomli"},   # tomli: TOML on Python 3.10 (3.11 has tomllib)
    "zerolib.chapter": {"numpy", "pandas", "matplotlib", "ipywidgets", "PIL"},
    "zerolib.crosscheck": {"numpy", "pandas", "torch", "deepspeed", "transformers", "megatron", "torchao"},
    "zerolib.publish": {"nbformat", "nbclient", "nbconvert", "ipykernel", "jupyter_client",
                        "traitlets", "zmq"},
    # The page's widgets; its server (zerolib.app.server, run in a process of its own) configures
    # Voila, jupyter_server and tornado.
    "zerolib.app": {"ipywidgets", "voila", "jupyter_server", "tornado", "traitlets", "zmq"},
    "zerolib.cli": {"nbclient", "torch", "zmq"},   # zmq: whether kernel sockets can be encrypted
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module
            found.add(module)
            # `from zerolib.chapter import style` imports the module zerolib.chapter.style
            found.update(f"{module}.{alias.name}" for alias in node.names
                         if (PACKAGE.parent / f"{module}.{alias.name}".replace(".", "/")).exists()
                         or (PACKAGE.parent / (f"{module}.{alias.name}".replace(".", "/") + ".py")).exists())
    return found


def part(module: str) -> tuple[str, int] | None:
    """(prefix, rank) of the part of the package ``module`` belongs to."""
    best = None
    for prefix, value in RANKS:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, value)
    return best


def rank(module: str) -> int | None:
    found = part(module)
    return None if found is None else found[1]


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def own_imports():
    for name, path in MODULES.items():
        for target in sorted(imports(path)):
            yield name, target


def test_every_import_points_down_a_layer():
    upward = [f"{source} imports {target}" for source, target in own_imports()
              if source != "zerolib" and target.startswith("zerolib")
              and rank(source) is not None and rank(target) is not None
              and rank(target) > rank(source)]
    assert not upward, "imports pointing up a layer:\n" + "\n".join(upward)


def test_every_module_has_a_layer():
    assert [name for name in MODULES if name != "zerolib" and rank(name) is None] == []


def test_no_two_parts_import_each_other():
    edges = defaultdict(set)
    for source, target in own_imports():
        if target.startswith("zerolib.") and source != "zerolib" and part(target):
            a, b = part(source)[0], part(target)[0]
            if a != b:
                edges[a].add(b)
    mutual = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges.get(b, ())})
    assert mutual == [], f"parts of the package importing each other: {mutual}"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_uses_only_its_own_third_party_packages(layer):
    foreign = sorted({f"{source}: {target}" for source, target in own_imports()
                      if (source == layer or source.startswith(layer + "."))
                      and target.split(".")[0] not in {"zerolib", *sys.stdlib_module_names}
                      and target.split(".")[0] not in ALLOWED[layer]})
    assert foreign == [], f"{layer} imports " + ", ".join(foreign)


def test_the_check_catches_an_upward_import(tmp_path, monkeypatch):
    """The walk is not vacuous: a core module importing the chapter is reported."""
    bad = PACKAGE / "core" / "memory" / "accounting.py"
    tree = imports(bad) | {"zerolib.chapter.style"}
    assert rank("zerolib.chapter.style") > rank(module_name(bad))
    assert any(rank(t) is not None and rank(t) > rank(module_name(bad)) for t in tree)


def test_the_page_sits_between_the_chapter_and_the_command_line():
    """The engineer's page draws with the chapter's charts and asks the core; the command line
    starts it as a server and never imports it (a subprocess runs it), so nothing beneath the
    page reaches up to it."""
    assert rank("zerolib.chapter.explorers") < rank("zerolib.app.page") < rank("zerolib.cli.app")
    page_imports = {t for s, t in own_imports() if s.startswith("zerolib.app")}
    assert "zerolib.chapter.charts.will_it_fit" in page_imports
    assert "zerolib.core.planner" in page_imports
    assert sorted(f"{s} imports {t}" for s, t in own_imports()
                  if t.startswith("zerolib.app") and not s.startswith("zerolib.app")) == []


def test_memory_never_imports_step():
    """The memory arithmetic answers "bytes per GPU" without the step's time model."""
    assert sorted(f"{s} imports {t}" for s, t in own_imports()
                  if s.startswith("zerolib.core.memory") and t.startswith("zerolib.core.step")) == []


def test_layer_sizes_and_longest_module(capsys):
    """Not a rule: prints what the closing note quotes (modules per layer, the longest one)."""
    per_layer = defaultdict(int)
    for name in MODULES:
        depth = 3 if name.startswith("zerolib.core.") and name.count(".") >= 3 else 2
        per_layer[".".join(name.split(".")[:depth])] += 1
    lengths = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in MODULES.items()}
    longest = max(lengths, key=lengths.get)
    with capsys.disabled():
        print("\nmodules per layer:", dict(sorted(per_layer.items())),
              f"longest: {longest} ({lengths[longest]} lines)")
    assert lengths[longest] < 700
