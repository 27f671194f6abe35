"""The packages form layers, and a module imports only from its own package or a lower layer.

``LAYERS`` is the one table of the layering; ``docs/architecture.md`` shows it, and a test here
checks that the two agree. Every ``import`` is checked, function-level ones included: a lazy import
still ties the packages together. Packages of the same layer are peers and do not import each other
(``rl`` does not reach into ``pretrain`` nor the reverse); the foundation layer is the exception,
where ``protocols`` names the records of ``types``.

Three more rules keep the graph honest: no two modules of one package import each other, directly
or round a longer loop (a cycle, usually hidden in a function-level or ``TYPE_CHECKING`` import);
Ray and vLLM are each imported by one module, their adapter; and an import named by a string (the
policy registry's ``module:function``, the CLI's handler names, ``importlib.import_module`` of a
constant) names a module that exists, a function it defines, and a package the table lets the
naming module import.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "opencomposer"

# Bottom to top. Names are top-level modules or packages of opencomposer.
LAYERS: list[tuple[str, ...]] = [
    ("types", "protocols", "io", "pysource", "config"),
    ("numerics",),
    ("model",),
    ("inference",),
    ("sandbox",),
    ("agent",),
    ("grading",),
    ("episode",),
    ("tasks",),
    ("distributed",),
    ("training",),
    ("rl", "pretrain", "bench"),
    ("services", "serve"),
    ("commands",),
    ("cli",),  # imports each command's handler by name when it runs
]
FOUNDATION = 0

# The one module that may import each of these third-party packages.
ADAPTERS = {"ray": "services.ray_backend", "vllm": "inference.vllm"}
STRING_IMPORT = re.compile(r"opencomposer((?:\.\w+)+)(?::(\w+))?")
IMPORTERS = ("import_module", "__import__")  # functions that import the module their first argument names


def layer_of(name: str) -> int:
    for index, names in enumerate(LAYERS):
        if name in names:
            return index
    raise KeyError(name)


def top_level(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def source_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "suites" not in p.relative_to(PACKAGE).parts)


def module_name(path: Path) -> str:
    """``agent/loop.py`` -> ``agent.loop``, ``agent/__init__.py`` -> ``agent``."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    base = PACKAGE.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def resolve(name: str) -> str:
    """The module of the tree a dotted name below opencomposer imports: its longest prefix that is a
    module (``loop.X`` of ``from opencomposer.agent.loop import X``), else the name itself."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if is_module(".".join(parts[:end])):
            return ".".join(parts[:end])
    return name


def imported_modules(tree: ast.AST, path: Path) -> list[tuple[int, str]]:
    """(line, module below opencomposer) for every import of the package, at any depth."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, resolve(alias.name.removeprefix("opencomposer.")))
                         for alias in node.names if alias.name.startswith("opencomposer."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = path.relative_to(PACKAGE).parts[: -node.level]
                parts = [*base, *(node.module or "").split(".")]
            elif (node.module or "").split(".")[0] == "opencomposer":
                parts = node.module.split(".")[1:]
            else:
                continue
            parent = ".".join(p for p in parts if p)
            found.extend((node.lineno, resolve(f"{parent}.{alias.name}" if parent else alias.name))
                         for alias in node.names)
    return found


def imported_names(tree: ast.AST, path: Path) -> list[tuple[int, str]]:
    """(line, top-level opencomposer name) for every import of the package, at any depth."""
    return [(line, module.split(".")[0]) for line, module in imported_modules(tree, path)]


def layer_problem(own: str, name: str) -> str | None:
    """Why top-level ``own`` may not import top-level ``name``; None when it may."""
    if name == own:
        return None
    try:
        their = layer_of(name)
    except KeyError:
        return f"imports unknown module opencomposer.{name}"
    own_layer = layer_of(own)
    if their < own_layer or (their == own_layer == FOUNDATION):
        return None
    where = "a peer of the same layer" if their == own_layer else "a higher layer"
    return f"{own} imports {name} ({where})"


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def violations() -> list[str]:
    problems = []
    for path in source_modules():
        own = top_level(path)
        if own == "__init__":
            continue
        try:
            layer_of(own)
        except KeyError:
            problems.append(f"{path.relative_to(ROOT)}: package {own!r} is missing from LAYERS")
            continue
        for line, name in imported_names(parse(path), path):
            problem = layer_problem(own, name)
            if problem:
                problems.append(f"{path.relative_to(ROOT)}:{line}: {problem}")
    return problems


def test_every_import_points_down() -> None:
    problems = violations()
    assert not problems, "layering broken:\n" + "\n".join(problems)


def test_every_package_is_in_the_table() -> None:
    present = {top_level(p) for p in source_modules()} - {"__init__"}
    present |= {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    present -= {"suites"}
    listed = {name for names in LAYERS for name in names}
    assert present - listed == set(), f"not in LAYERS: {sorted(present - listed)}"
    assert listed - present == set(), f"in LAYERS but absent: {sorted(listed - present)}"


def test_the_check_catches_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: an import inside a function, from a lower layer to a higher one, is found."""
    source = "def f():\n    from opencomposer.rl.loop import run_rl\n    import opencomposer.grading.grade\n"
    fake = PACKAGE / "model" / "fake.py"
    names = imported_names(ast.parse(source), fake)
    assert names == [(2, "rl"), (3, "grading")]
    assert all(layer_of(n) > layer_of("model") for _, n in names)


def documented_layers() -> list[tuple[str, ...]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"<!-- layers -->\n```\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no <!-- layers --> block"
    rows = []
    for line in block.group(1).strip().splitlines():
        rows.append(tuple(name.strip().strip("`") for name in line.split(",")))
    return rows[::-1]  # the document lists top first


def test_docs_show_the_same_table() -> None:
    assert documented_layers() == LAYERS


def import_graph() -> dict[str, set[str]]:
    """Each module -> the other modules of its own top-level package that it imports."""
    graph: dict[str, set[str]] = {}
    for path in source_modules():
        own = module_name(path)
        if not own:
            continue
        package = own.split(".")[0]
        graph[own] = {module for _, module in imported_modules(parse(path), path)
                      if module != own and module.split(".")[0] == package}
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The modules that reach one another through ``graph``, as groups of two or more."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reached = {module: reach(module) for module in graph}
    return {frozenset({module} | {other for other in seen if module in reached.get(other, ())})
            for module, seen in reached.items() if module in seen}


def test_no_import_cycle_inside_a_package() -> None:
    found = cycles(import_graph())
    unexpected = sorted(sorted(group) for group in found)
    assert not unexpected, f"modules that import each other: {unexpected}"


def test_the_cycle_check_finds_a_loop_of_three() -> None:
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}
    assert cycles(graph) == {frozenset({"a.x", "a.y", "a.z"})}
    assert cycles({"a.x": {"a.y"}, "a.y": set()}) == set()


def third_party_imports(tree: ast.AST) -> set[str]:
    """Top-level names of the packages a module imports, by statement or by ``import_module("...")``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Call) and called_name(node) in IMPORTERS and node.args:
            if isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                names.add(node.args[0].value.split(".")[0])
    return names


def called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def test_ray_and_vllm_are_each_imported_by_their_adapter_only() -> None:
    importers = {package: set() for package in ADAPTERS}
    for path in source_modules():
        for package in third_party_imports(parse(path)) & ADAPTERS.keys():
            importers[package].add(module_name(path))
    assert importers == {package: {adapter} for package, adapter in ADAPTERS.items()}


def string_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, function or None) for every string constant of ``path`` that names a module
    of the package (``opencomposer.agent.policies.local:local_policy``, ``opencomposer.commands.rl``)."""
    found = []
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = STRING_IMPORT.fullmatch(node.value)
            if match:
                found.append((node.lineno, match.group(1).removeprefix("."), match.group(2)))
    return found


def defines(module: str, name: str) -> bool:
    """Whether ``module`` binds ``name`` at its top level (a function, class, assignment or import)."""
    base = PACKAGE.joinpath(*module.split("."))
    tree = parse(base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py")
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(target, ast.Name) and target.id == name for target in targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (alias.asname or alias.name) == name for alias in node.names):
            return True
    return False


def string_import_problems() -> list[str]:
    problems = []
    for path in source_modules():
        own = top_level(path)
        for line, module, function in string_imports(path):
            where = f"{path.relative_to(ROOT)}:{line}: opencomposer.{module}"
            if not is_module(module):
                problems.append(f"{where} is no module")
            elif function and not defines(module, function):
                problems.append(f"{where} defines no {function}")
            else:
                problem = layer_problem(own, module.split(".")[0])
                if problem:
                    problems.append(f"{where}: {problem}")
    return problems


def test_imports_named_by_strings_resolve_and_point_down() -> None:
    problems = string_import_problems()
    assert not problems, "string-named imports broken:\n" + "\n".join(problems)


def test_the_string_check_reads_the_policy_registry_and_the_cli() -> None:
    """The registries are found (so the check above has something to check), and a name that
    points nowhere is caught."""
    policies = {(module, function) for _, module, function in string_imports(PACKAGE / "agent" / "policy.py")}
    assert ("agent.policies.local", "local_policy") in policies
    handlers = string_imports(PACKAGE / "cli.py")
    assert len(handlers) >= 10 and all(module.startswith("commands.") and function for _, module, function in handlers)
    assert not defines("agent.policies.local", "no_such_policy") and not is_module("agent.no_such_module")
