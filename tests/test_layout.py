"""The three homes, as DESIGN.md and docs/library.md draw them (issue 48): the learner's
library (``gradaccum_lib``, at most 3,600 lines and 100 public names), the course that serves
the notebooks (``gradaccum_course``) and the recipe (``recipes/emr_classification``). The
library imports neither of the others and the recipe not the course; no private name crosses a
module; the core imports no wing; the loop is one function of at most 55 lines of code and 8
parameters, and following a window to ``optimizer.step()`` reads it and at most its sync
helper; no other library function both backpropagates and steps; the sync flag is set in that
loop only (and in the peers held against it); functions stay short; a public name is one
something outside its module uses."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gradaccum_lib"
COURSE, RECIPES = ROOT / "gradaccum_course", ROOT / "recipes"
WINGS = ("measure", "workloads")
CORE = sorted(path for path in PACKAGE.glob("*.py") if path.name != "__init__.py")
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_FUNCTION_LINES = 60
#: the loop's body, in lines of code: no docstring, comment or blank line (issue 48)
MAX_LOOP_LINES, MAX_LOOP_PARAMETERS = 55, 8
#: the learner's library (issue 48): 149 public names and 7,587 lines before the three homes
MAX_PUBLIC_NAMES, MAX_LIBRARY_LINES = 100, 3600
#: where the three homes' code lives, and the programs and maintenance code around them
HOMES = ("gradaccum_lib", "gradaccum_course", "recipes")
CODE = (*HOMES, "scripts", "benchmarks")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _imported_modules(path: Path, prefix: str = "gradaccum_lib") -> set[str]:
    """The modules starting with ``prefix`` that ``path`` imports, as dotted names."""
    package = path.parent.relative_to(ROOT).as_posix().replace("/", ".")
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - max(node.level - 1, 0)]
            name = (".".join(base) + ("." + node.module if node.module else "")
                    if node.level else node.module or "")
            if name.startswith(prefix):
                found.add(name)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith(prefix)}
    return found


def _public_names(tree: ast.Module) -> list[str]:
    """Module-level names a module defines without a leading underscore."""
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return [name for name in names if not name.startswith("_")]


def _declared(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return [element.value for element in node.value.elts]
    return None


def _readers() -> dict[str, str]:
    """Every text that may use a public name: the three homes, tests, scripts, benchmarks, the
    notebooks' code cells (English; the twins hold the same code), the Makefile."""
    texts = {_relative(p): p.read_text(encoding="utf-8") for folder in (*CODE, "tests")
             for p in (ROOT / folder).rglob("*.py")}
    texts["conftest.py"] = (ROOT / "conftest.py").read_text(encoding="utf-8")
    texts["Makefile"] = (ROOT / "Makefile").read_text(encoding="utf-8")
    for notebook in [*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("notebooks/solutions/*.ipynb")]:
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        texts[_relative(notebook)] = "\n".join(
            "".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")
    return texts


def test_the_library_imports_neither_the_course_nor_the_recipe_and_the_recipe_not_the_course():
    for path in MODULES:
        assert not _imported_modules(path, "gradaccum_course"), f"{_relative(path)} imports it"
        assert not _imported_modules(path, "recipes"), f"{_relative(path)} imports the recipe"
    for path in sorted(RECIPES.rglob("*.py")):
        assert not _imported_modules(path, "gradaccum_course"), f"{_relative(path)} imports it"


def test_no_private_name_crosses_a_module_outside_the_tests():
    crossing = [f"{_relative(path)}: {alias.name} from {node.module}"
                for folder in CODE for path in sorted((ROOT / folder).rglob("*.py"))
                for node in ast.walk(_tree(path))
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "")
                                                         .startswith(("gradaccum", "recipes")))
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not crossing, "make them public where they are needed: " + "; ".join(crossing)


def test_the_library_is_at_most_3600_lines():
    lines = sum(path.read_text(encoding="utf-8").count("\n") for path in MODULES)
    assert lines <= MAX_LIBRARY_LINES, f"gradaccum_lib holds {lines} lines"


def test_the_core_imports_no_wing():
    for path in CORE:
        wings = {m for m in _imported_modules(path) if m.split(".")[1:2] and
                 m.split(".")[1] in WINGS}
        assert not wings, f"{_relative(path)} (core) imports the wing(s) {sorted(wings)}"


def _loop() -> ast.FunctionDef:
    return next(node for node in _tree(PACKAGE / "accumulation.py").body
                if isinstance(node, ast.FunctionDef) and node.name == "accumulate_window")


def _lines_of_code(function: ast.FunctionDef, path: Path = PACKAGE / "accumulation.py") -> int:
    """The lines of ``function``'s body (in ``path``) that hold code: not its docstring, a
    comment or a blank line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    body = function.body
    if isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                    ast.Constant):
        body = body[1:]  # the docstring
    if not body:
        return 0
    code = lines[body[0].lineno - 1: function.end_lineno]
    return sum(1 for line in code if line.strip() and not line.strip().startswith("#"))


def test_the_loop_is_one_function_of_at_most_55_lines_of_code_and_8_parameters():
    count = _lines_of_code(_loop())
    assert 20 < count <= MAX_LOOP_LINES, (
        f"accumulate_window's body holds {count} lines of code; the loop a learner reads on "
        f"one screen holds at most {MAX_LOOP_LINES}")
    arguments = _loop().args
    parameters = len(arguments.args) + len(arguments.kwonlyargs)
    assert parameters <= MAX_LOOP_PARAMETERS and not arguments.vararg and not arguments.kwarg


def _steps_under_a_sync_flag(function: ast.FunctionDef) -> bool:
    """Whether ``function`` calls ``.backward(``, an optimizer's ``.step(`` and sets a sync flag
    (or enters the sync helper): a second accumulation loop."""
    calls = [node.func for node in ast.walk(function) if isinstance(node, ast.Call)]
    attributes = {getattr(func, "attr", None) for func in calls}
    names = {getattr(func, "id", None) for func in calls}
    return ("backward" in attributes and "step" in attributes and bool(
        attributes & {"no_sync", "set_requires_gradient_sync"} or "_gradient_sync" in names))


def test_no_library_function_but_the_loop_backpropagates_and_steps_under_a_sync_flag():
    found = [f"{_relative(path)}: {node.name}" for path in MODULES
             for node in ast.walk(_tree(path)) if isinstance(node, ast.FunctionDef)
             and node.name != "accumulate_window" and _steps_under_a_sync_flag(node)]
    assert _steps_under_a_sync_flag(_loop())  # the check sees the loop's own
    assert not found, found


def _raises(statement: ast.stmt) -> bool:
    """Whether ``statement`` is a raise or a call of a function named ``_raise...``."""
    return isinstance(statement, ast.Raise) or (
        isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
        and getattr(statement.value.func, "id", "").startswith("_raise"))


def test_a_window_reads_the_loop_and_at_most_its_sync_helper():
    """Following a window to ``optimizer.step()`` reads accumulate_window and, of the
    module's other functions, the sync helper and the window's totals only: the argument
    checks run at the door, the rest only on the way to an error. The core's loop imports
    the loss contract and runtime's checks, nothing else."""
    engine = PACKAGE / "accumulation.py"
    assert _imported_modules(engine) <= {"gradaccum_lib.batches", "gradaccum_lib.runtime"}
    tree = _tree(engine)
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    loop = _loop()
    on_error_paths = {id(node) for branch in ast.walk(loop)
                      if isinstance(branch, ast.If) and branch.body and _raises(branch.body[-1])
                      for node in ast.walk(branch)}
    called = [node.func.id for node in ast.walk(loop) if isinstance(node, ast.Call)
              and isinstance(node.func, ast.Name) and node.func.id in functions]
    on_the_way = {node.func.id for node in ast.walk(loop) if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Name) and node.func.id in functions
                  and id(node) not in on_error_paths}
    door = loop.body[1] if isinstance(loop.body[0].value, ast.Constant) else loop.body[0]
    assert getattr(door.value.func, "id", "") == "_check_arguments", "the door comes first"
    # the sync helper, and the window's totals (a collective's tensors belong on the device its
    # backend reduces on: where readers trip)
    assert on_the_way == {"_check_arguments", "_gradient_sync", "_window_totals"}, sorted(
        on_the_way)
    assert called.count("_check_arguments") == 1


def _sync_flag_writers(path: Path) -> list[int]:
    """The lines of ``path`` that set a gradient-sync flag: ``no_sync()``,
    ``set_requires_gradient_sync(...)``, or an assignment to ``require_backward_grad_sync``."""
    found = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr in ("no_sync", "set_requires_gradient_sync")):
            found.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign)) and any(
                isinstance(t, ast.Attribute) and t.attr == "require_backward_grad_sync"
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
            found.append(node.lineno)
    return found


def test_the_correct_loop_is_written_once_in_the_package_and_the_scripts():
    """Issue 36: every loop the library, the course, the recipe or a script runs is
    accumulate_window. The sync flag, which every accumulating loop under DDP or FSDP2 must set,
    is set in accumulation.py and in the peers held against it (audits/frameworks.py:
    nanoGPT's and Accelerate's loops); the course's programs make a model's switch a no-op for
    the slow way they compare with (programs/__init__.py); benchmarks and notebooks hold the
    peers and the lessons, and are not looked at."""
    allowed = {"gradaccum_lib/accumulation.py", "gradaccum_course/audits/frameworks.py",
               "gradaccum_course/programs/__init__.py"}
    writers = {_relative(path): lines for folder in (*HOMES, "scripts")
               for path in sorted((ROOT / folder).rglob("*.py"))
               if (lines := _sync_flag_writers(path))}
    assert "gradaccum_lib/accumulation.py" in writers  # the check sees the loop's own
    assert set(writers) <= allowed, {k: v for k, v in writers.items() if k not in allowed}


def test_no_function_is_longer_than_sixty_lines_of_code():
    long = [f"{_relative(path)}:{node.lineno} {node.name} ({count})"
            for path in MODULES for node in ast.walk(_tree(path))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (count := _lines_of_code(node, path)) > MAX_FUNCTION_LINES]
    assert not long, "functions over 60 lines of code: " + "; ".join(long)


def test_all_lists_exactly_the_public_names():
    for path in MODULES:
        tree = _tree(path)
        declared = _declared(tree)
        if path.name == "__init__.py" and declared is None:
            continue
        public = set(_public_names(tree))
        if path.name == "__init__.py":  # the package: the contract, re-exported
            continue
        assert declared is not None, f"{_relative(path)} has no __all__"
        assert public == set(declared), (
            f"{_relative(path)}: public but not in __all__: {sorted(public - set(declared))}; "
            f"in __all__ but not defined here: {sorted(set(declared) - public)}")


@pytest.fixture(scope="module")
def readers() -> dict[str, str]:
    return _readers()


#: public names that only tests use: none (a name that comes to be used only so fails the test
#: below).
USED_ONLY_BY_TESTS_SCRIPTS_OR_BENCHMARKS: set[str] = set()


def _handed_to_callers(tree: ast.Module) -> set[str]:
    """The module's classes a public function of it returns (its return annotation names
    them) or that it raises: public with the function, whoever names them."""
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    handed = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns:
            handed |= {n.id for n in ast.walk(node.returns) if isinstance(n, ast.Name)}
            handed |= {n.value for n in ast.walk(node.returns)
                       if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            handed.add(getattr(node.exc.func, "id", ""))
    return handed & classes


def test_every_public_name_is_used_by_a_notebook_the_job_or_another_module(readers):
    """Issue 48: a public name of the library is one a notebook, the recipe, the course, a
    script or benchmark, or another library module uses; names only tests use are private.
    Types a public function returns or raises are public with it."""
    package_and_notebooks = {where: text for where, text in readers.items()
                             if not where.startswith("tests/")}
    found = set()
    for path in MODULES:
        if path.name == "__init__.py":
            continue
        tree = _tree(path)
        handed = _handed_to_callers(tree)
        for name in _declared(tree) or []:
            pattern = re.compile(rf"\b{re.escape(name)}\b")
            if name not in handed and not any(
                    pattern.search(text) for where, text in package_and_notebooks.items()
                    if where != _relative(path)):
                found.add(f"{_relative(path)}: {name}")
    assert found <= USED_ONLY_BY_TESTS_SCRIPTS_OR_BENCHMARKS, (
        "public, but only tests use them (make them private): "
        + ", ".join(sorted(found - USED_ONLY_BY_TESTS_SCRIPTS_OR_BENCHMARKS)))
    assert found == USED_ONLY_BY_TESTS_SCRIPTS_OR_BENCHMARKS, (
        "private or used now: strike off USED_ONLY_BY_TESTS_SCRIPTS_OR_BENCHMARKS "
        + ", ".join(sorted(USED_ONLY_BY_TESTS_SCRIPTS_OR_BENCHMARKS - found)))


def test_every_public_name_is_used_outside_its_module(readers):
    unused, total = [], 0
    for path in MODULES:
        tree = _tree(path)
        names = _declared(tree) or []
        if path.name == "__init__.py":
            continue  # the package's re-export of the contract defines no name
        dotted = _relative(path)[:-3].replace("/", ".")
        runs_as_program = f"-m {dotted}" in "\n".join(readers.values()) or (
            "__main__" in path.read_text(encoding="utf-8"))
        for name in names:
            total += 1
            if name == "main" and runs_as_program:
                continue  # a program's entry point, run by python -m
            pattern = re.compile(rf"\b{re.escape(name)}\b")
            if not any(pattern.search(text) for where, text in readers.items()
                       if where != _relative(path)):
                unused.append(f"{_relative(path)}: {name}")
    assert not unused, "public names nothing outside their module uses: " + ", ".join(unused)
    assert total <= MAX_PUBLIC_NAMES, f"{total} public names; the layout allows {MAX_PUBLIC_NAMES}"
