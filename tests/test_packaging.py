"""pyproject.toml and environment.yml describe the same environment, and what they promise exists.

Conda cannot be reached from the project's machines, so instead of solving environment.yml this
test parses both files and compares them: every dependency of pyproject's ``dependencies`` and of
its ``test`` extra appears in environment.yml under its conda-forge name with the same lower
bound, and nothing else does.
"""
from __future__ import annotations

import ast
import functools
import importlib
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
import yaml

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"
ENVIRONMENT = REPO / "environment.yml"

# conda-forge names of the PyPI distributions that are published under another name there.
CONDA_NAMES = {"torch": "pytorch", "playwright": "playwright-python"}
# Extras that environment.yml carries; `validate` (PyTorch, a large download) is left out on
# purpose and environment.yml says how to add it.
MIRRORED_EXTRAS = ("test",)
# Packages a conda environment needs that are not Python dependencies of the project.
CONDA_ONLY = {"python", "pip"}

_REQUIREMENT = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?P<spec>[^;]*?)\s*(?:;(?P<marker>.*))?$")
_LOWER_BOUND = re.compile(r"^>=\s*(?P<version>[0-9]+(?:\.[0-9]+)*)$")


def normalise(name: str) -> str:
    """PEP 503 name normalisation: case and runs of ``-_.`` do not matter."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirement(text: str) -> tuple[str, str]:
    """``"numpy>=1.24"`` -> ``("numpy", ">=1.24")``; markers are dropped."""
    match = _REQUIREMENT.match(text)
    if not match:
        raise ValueError(f"cannot parse requirement {text!r}")
    return normalise(match["name"]), match["spec"].replace(" ", "")


def load_pyproject() -> dict:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))


def load_environment() -> dict:
    return yaml.safe_load(ENVIRONMENT.read_text(encoding="utf-8"))


def pyproject_requirements(project: dict, extras=MIRRORED_EXTRAS) -> dict[str, str]:
    """Conda-forge name -> specifier for the core dependencies and the given extras."""
    texts = list(project["project"]["dependencies"])
    for extra in extras:
        texts += project["project"]["optional-dependencies"][extra]
    wanted = {}
    for text in texts:
        name, spec = parse_requirement(text)
        wanted[CONDA_NAMES.get(name, name)] = spec
    return wanted


def conda_requirements(environment: dict) -> dict[str, str]:
    """Conda package name -> specifier, from the plain (non-pip) entries of environment.yml."""
    found = {}
    for entry in environment["dependencies"]:
        if isinstance(entry, str):
            name, spec = parse_requirement(entry)
            found[name] = spec
    return found


def drift(project: dict, environment: dict) -> list[str]:
    """Every disagreement between the two files, one readable line each (empty: they agree)."""
    wanted = pyproject_requirements(project)
    found = {name: spec for name, spec in conda_requirements(environment).items()
             if name not in CONDA_ONLY}
    problems = [f"{name}{spec} is in pyproject.toml but not in environment.yml"
                for name, spec in wanted.items() if name not in found]
    problems += [f"{name}{spec} is in environment.yml but not in pyproject.toml"
                 for name, spec in found.items() if name not in wanted]
    problems += [f"{name}: pyproject.toml says {wanted[name] or 'no bound'}, "
                 f"environment.yml says {found[name] or 'no bound'}"
                 for name in wanted.keys() & found.keys() if wanted[name] != found[name]]
    return sorted(problems)


def pip_entries(environment: dict) -> list[str]:
    for entry in environment["dependencies"]:
        if isinstance(entry, dict) and "pip" in entry:
            return list(entry["pip"])
    return []


# --- the two files agree -------------------------------------------------------------------------

def test_environment_yml_mirrors_pyproject():
    problems = drift(load_pyproject(), load_environment())
    assert not problems, "environment.yml and pyproject.toml disagree:\n" + "\n".join(problems)


def test_drift_is_reported():
    """The comparison notices a changed bound, a missing package and an extra one."""
    project = load_pyproject()
    agreeing = {"channels": ["conda-forge"], "dependencies": [
        "python>=3.10", "pip", *(f"{name}{spec}" for name, spec in pyproject_requirements(project).items())]}
    assert drift(project, agreeing) == []
    entries = agreeing["dependencies"]
    entries[entries.index("numpy>=1.24")] = "numpy>=1.20"   # bound lowered
    entries.remove("pytest>=8.0")                            # package dropped
    entries.append("scipy>=1.11")                            # package added
    assert drift(project, agreeing) == [
        "numpy: pyproject.toml says >=1.24, environment.yml says >=1.20",
        "pytest>=8.0 is in pyproject.toml but not in environment.yml",
        "scipy>=1.11 is in environment.yml but not in pyproject.toml",
    ]


def test_environment_python_matches_requires_python():
    requires = load_pyproject()["project"]["requires-python"].replace(" ", "")
    assert conda_requirements(load_environment())["python"] == requires


def test_environment_uses_conda_forge_and_installs_the_checkout():
    environment = load_environment()
    assert environment["channels"][0] == "conda-forge"
    assert "defaults" not in environment["channels"]
    assert pip_entries(environment) == ["-e ."]


# --- pyproject.toml promises what it should ------------------------------------------------------

def test_every_dependency_has_a_lower_bound():
    project = load_pyproject()["project"]
    texts = list(project["dependencies"]) + [
        text for extra in project["optional-dependencies"].values() for text in extra]
    unbounded = [text for text in texts if not _LOWER_BOUND.match(parse_requirement(text)[1])]
    assert not unbounded, f"dependencies without a plain '>=' lower bound: {unbounded}"


def test_extras_exist():
    extras = {name: {parse_requirement(t)[0] for t in texts}
              for name, texts in load_pyproject()["project"]["optional-dependencies"].items()}
    assert {"pytest", "playwright"} <= extras["test"]   # the browser tests drive Playwright
    assert "torch" in extras["validate"]


def test_console_script_points_at_the_cli():
    target = load_pyproject()["project"]["scripts"]["zerolib"]
    module_name, _, attribute = target.partition(":")
    assert callable(getattr(importlib.import_module(module_name), attribute))
    # The installed metadata agrees (a stale install would not have the script).
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")
                 if ep.dist is not None and normalise(ep.dist.name) == "zerolib"}
    assert installed.get("zerolib") == target


def test_console_script_runs():
    script = Path(sys.executable).parent / "zerolib"
    if not script.exists():
        pytest.fail(f"{script} is missing: install the project with pip install -e '.[test]'")
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage: zerolib" in result.stdout
    for command in ("estimate", "html"):
        assert command in result.stdout


def _readme_entry_points() -> list[list[str]]:
    """Every command the README tells a reader to run, as the argv of its --help."""
    from zerolib.cli import SUBCOMMANDS, build_parser

    build_parser()   # the subcommands register their names
    names = [module.__name__.rpartition(".")[2].replace("_", "-") for module in SUBCOMMANDS]
    from conftest import documentation_text
    readme = documentation_text()
    told = [name for name in names if f"zerolib {name}" in readme]
    return ([["zerolib", name, "--help"] for name in told] + [["zerolib", "--help"]]
            + [[sys.executable, "-m", "zerolib", "--help"],
               [sys.executable, "benchmarks/run.py", "--help"]])


def test_every_entry_point_the_readme_names_answers_help():
    script = Path(sys.executable).parent / "zerolib"
    entries = _readme_entry_points()
    assert len(entries) >= 8    # estimate, models, figures, notebooks, html, validate, measure-deepspeed...
    for argv in entries:
        argv = [str(script), *argv[1:]] if argv[0] == "zerolib" else argv
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
        assert result.returncode == 0, f"{argv}: {result.stderr}"
        assert "usage" in result.stdout.lower(), argv


# --- what the code imports is declared ----------------------------------------------------------

def imported_modules(folder: Path) -> set[str]:
    """Top-level names of every module imported anywhere (also inside functions) under ``folder``."""
    names = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.partition(".")[0])
    return names


@functools.cache
def _installed_distributions() -> dict:
    return importlib.metadata.packages_distributions()  # slow: reads every installed package


# Modules whose distribution has another name, for a machine without the optional extras
# (megatron-core's wheel provides the package ``megatron``: its METADATA and top_level.txt).
NAMED_OTHERWISE = {"megatron": "megatron-core"}


def distribution_of(module: str) -> str:
    """The distribution that provides ``module`` (its known or own name when not installed)."""
    provided = _installed_distributions().get(module)
    return normalise(provided[0]) if provided else normalise(NAMED_OTHERWISE.get(module, module))


@pytest.mark.parametrize("folder, extras", [("zerolib", ("validate", "deepspeed")),
                                            ("tests", ("test", "validate"))])
def test_imports_are_declared(folder, extras):
    project = load_pyproject()["project"]
    declared = {parse_requirement(t)[0] for t in project["dependencies"]}
    for extra in extras:
        declared |= {parse_requirement(t)[0] for t in project["optional-dependencies"][extra]}
    local = {"zerolib", "conftest", *(p.stem for p in (REPO / folder).glob("*.py"))}
    third_party = {m for m in imported_modules(REPO / folder)
                   if m not in sys.stdlib_module_names and m not in local}
    undeclared = sorted(f"{m} (distribution {distribution_of(m)})" for m in third_party
                        if distribution_of(m) not in declared)
    assert not undeclared, f"{folder}/ imports undeclared packages: {undeclared}"


def test_code_passes_the_linter():
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.fail(f"{ruff} is missing: install the project with pip install -e '.[test]'")
    result = subprocess.run([str(ruff), "check", "zerolib", "tests", "benchmarks"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
