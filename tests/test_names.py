"""Names the package defines: no module imports another module's private (``_x``) name, and no
two modules give one public name to different things where a reader would take them for one.
Read from the source (an AST walk), like tests/test_layers.py."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "zerolib"



def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(dotted: str) -> bool:
    base = PACKAGE.parent / dotted.replace(".", "/")
    return base.is_dir() or base.with_suffix(".py").exists()


def private_imports(name: str, source: str) -> set[str]:
    """``module._x`` for every private name of another zerolib module that ``source`` (the
    module ``name``) imports or reads through a module it imported. A private module (``_io``,
    ``cli/_placement``) is a module, not a name: importing it is not reported."""
    package = name.rpartition(".")[0]
    tree = ast.parse(source)
    found, aliases = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            if not module.startswith("zerolib"):
                continue
            for alias in node.names:
                target = f"{module}.{alias.name}"
                if is_module(target):
                    aliases[alias.asname or alias.name] = target
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.add(target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("zerolib") and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not is_module(f"{aliases[node.value.id]}.{node.attr}")):
            found.add(f"{aliases[node.value.id]}.{node.attr}")
    return {target for target in found if target.rpartition(".")[0] != name}


def test_no_module_imports_another_modules_private_name():
    found = {(module_name(path), target) for path in sorted(PACKAGE.rglob("*.py"))
             for target in private_imports(module_name(path), path.read_text(encoding="utf-8"))}
    assert sorted(found) == [], "make these public or move them"


def test_the_check_sees_both_ways_of_reaching_a_private_name():
    source = ("from zerolib.core.inputs import _as_array, check_gpus\n"
              "from zerolib.core.catalogue import nodes\n"
              "from zerolib import _io\n"
              "nodes._nodes(None, 1)\n")
    assert private_imports("zerolib.chapter.figures", source) == {
        "zerolib.core.inputs._as_array", "zerolib.core.catalogue.nodes._nodes"}
    # a module's own private names, and private modules, are its own business
    assert private_imports("zerolib.core.inputs", "from zerolib.core.inputs import _as_array\n") == set()


# Each catalogue's name belongs to the module that holds it; a second constant of that name
# elsewhere (the planner explorer's own MODELS tuple, the CLI's DEVICES of offload targets) is a
# list a reader takes for the catalogue, and one that drifts from it.
CATALOGUE_NAMES = {"MODELS": "zerolib.core.catalogue.models",
                   "DEVICES": "zerolib.core.catalogue.devices",
                   "LINKS": "zerolib.core.catalogue.links",
                   "NODES": "zerolib.core.catalogue.nodes",
                   "LAYOUTS": "zerolib.core.memory.accounting"}


def defined_names(source: str) -> set[str]:
    names = set()
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        names.update(t.id for t in targets if isinstance(t, ast.Name))
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def test_a_catalogue_name_is_defined_only_by_its_catalogue():
    found = sorted(f"{module_name(path)} defines {name}" for path in sorted(PACKAGE.rglob("*.py"))
                   for name in defined_names(path.read_text(encoding="utf-8")) & set(CATALOGUE_NAMES)
                   if module_name(path) != CATALOGUE_NAMES[name])
    assert found == []


def test_the_catalogue_check_sees_a_second_models():
    assert "MODELS" in defined_names('MODELS = ("llama-2-7b",)\n')
