"""The architecture as a check: agentbox's import graph, drawn from the code, has no circle and follows the layers.

Every import counts: at module level, inside functions (agentbox defers many for start-up time) and under
`if TYPE_CHECKING:`. A package may import its own modules and any layer below its own, never one above
and never a sibling in its own layer. `make lint` and CI run this file.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(__file__).resolve().parent.parent / "agentbox"

# Top to bottom. A name is a subpackage of agentbox, or a top-level module. The entries of one layer are
# independent of each other, except in the top one: the command line (the cli package and `python -m agentbox`).
LAYERS: list[tuple[str, ...]] = [
    ("cli", "__main__"),
    ("tasks",),
    ("session",),
    ("review", "sync", "credentials", "runtime"),
    ("vm", "remote"),
    ("config",),
    ("agents", "net", "git"),
    ("errors", "paths", "fsutil", "progress", "safetext", "sizes", "resources", "timing", "terminal", "logline",
     "hosttools", "vmread", "livemarkers", "staginglayout", "tables", "lazyre", "__init__"),
]
# The layers whose entries may import each other (still without a circle): the command line, the ground floor.
CONNECTED = {0, len(LAYERS) - 1}
# Imports that break the rules on purpose, each with why. (None today.)
ALLOWED: dict[tuple[str, str], str] = {}


def module_files(package: Path) -> dict[str, Path]:
    """{dotted module name relative to the package: file}; a package is named by its folder."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, modules: Iterable[str], root: str) -> set[str]:
    """The package's modules `name` imports, wherever the import statement is."""
    known = set(modules)
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                module = ".".join([root, *base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" for alias in node.names]  # a module, or a name in `module`
        for target in targets:
            if target != root and not target.startswith(root + "."):
                continue
            relative = target[len(root) + 1:]
            while relative and relative not in known:
                relative = relative.rpartition(".")[0]
            if relative and relative != name:
                found.add(relative)
    return found


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = module_files(package)
    return {name: imports_of(name, path, modules, package.name) for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles (strongly connected components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def layer_of(module: str, layers: list[tuple[str, ...]]) -> tuple[int, str] | None:
    top = module.split(".")[0]
    for number, layer in enumerate(layers):
        if top in layer:
            return number, top
    return None


def violations(edges: dict[str, set[str]], layers: list[tuple[str, ...]], connected: set[int],
               allowed: dict[tuple[str, str], str]) -> list[str]:
    problems = []
    for module in sorted(edges):
        place = layer_of(module, layers)
        if place is None:
            problem = f"{module.split('.')[0]} is in no layer: add it to LAYERS in {Path(__file__).name}"
            problems += [] if problem in problems else [problem]
            continue
        for target in sorted(edges[module]):
            other = layer_of(target, layers)
            if other is None or other[1] == place[1] or (module, target) in allowed:
                continue
            if other[0] < place[0]:
                problems.append(f"{module} imports {target}, a layer above it ({other[1]} over {place[1]})")
            elif other[0] == place[0] and place[0] not in connected:
                problems.append(f"{module} imports {target}, a sibling in its layer ({place[1]} and {other[1]})")
    return problems


def test_the_import_graph_has_no_circle() -> None:
    assert cycles(graph()) == []


def test_every_import_follows_the_layers() -> None:
    assert violations(graph(), LAYERS, CONNECTED, ALLOWED) == []


def test_the_allowed_exceptions_are_still_needed() -> None:
    edges = graph()
    assert [pair for pair in ALLOWED if pair[1] not in edges.get(pair[0], set())] == []


def test_each_package_says_what_it_is_and_what_it_may_import() -> None:
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        lines = [line for line in doc.splitlines() if line.strip()]
        assert len(lines) == 2, f"{init}: two lines (what it is; what it may import), not {lines}"
        assert "import" in lines[1], f"{init}: the second line says what the package may import"


def test_the_ground_floor_stays_small() -> None:
    top_level = sorted(path.stem for path in PACKAGE.glob("*.py"))
    declared = {name for layer in LAYERS for name in layer}
    assert set(top_level) <= declared
    assert len(LAYERS[-1]) <= 17


# Which modules start host processes, and which programs each may look up (hosttools.which), with why. A
# process the host starts is where project-controlled input could execute: the list stays short and reviewed.
PROCESS_STARTERS: dict[str, str] = {
    "vm.lima": "the only module that runs limactl (and ssh into a Lima VM, and ps to find its own tunnels)",
    "git.store": "the only git runner on agentbox's own store; never on a workspace's git folder",
    "credentials.loginfiles": "`git config --file ~/.gitconfig` on the user's own file, `gh auth token` for the keychain",
    "config.cacerts": "openssl to describe a CA file, `security` to list the macOS System keychain",
    "net.guard": "starts the host proxy (agentbox.net.proxy) as a detached python process",
    "net.certauthority": "openssl to make the credential broker's per-VM CA and its leaves (keys through pipes, never argv)",
    "net.qemuhold": "becomes the VM's QEMU (exec) with its network held, run by Lima through QEMU_SYSTEM_<ARCH> "
                    "(agentbox.net.hold); it never runs limactl",
    "session.attention": "starts the host watcher (agentbox.tasks.watcher) that turns a session's events into notifications",
    "session.checkpointing": "starts a live session's end checkpoint (agentbox.session.endcheckpoint) as a detached "
                           "python process, once the launch returns (PATH without the workspace's folders)",
    "session.notify": "osascript (macOS) or notify-send (Linux) for a desktop notification",
    "remote.far": "limactl on a remote host (the far end runs there, never on this machine), sysctl for its memory",
    "tasks.keeper": "starts a remote task's keeper (itself, `python -m`) as a detached process",
    "remote.ssh": "the only module that runs ssh to a remote host (the user's own ssh, one multiplexed connection)",
}
PROGRAMS: dict[str, set[str]] = {
    "git": {"git.store", "credentials.loginfiles"}, "ssh": {"vm.lima", "remote.ssh"}, "ps": {"vm.lima"},
    "gh": {"credentials.loginfiles"},
    "openssl": {"config.cacerts", "net.certauthority"}, "security": {"config.cacerts"}, "osascript": {"session.notify"},
    "notify-send": {"session.notify"}, "limactl": {"remote.far"},
}
_STARTS = ("subprocess", "sh", "pty")


def starts_processes(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(alias.name in _STARTS for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module in _STARTS:
            return True
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" and (
                node.attr.startswith(("exec", "spawn", "posix_spawn")) or node.attr in ("system", "popen", "fork")):
            return True
    return False


def looked_up_programs(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "which"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value)
    return found


def test_only_the_listed_modules_start_host_processes() -> None:
    starters = {name for name, path in module_files(PACKAGE).items() if starts_processes(path)}
    assert starters == set(PROCESS_STARTERS)


def test_each_host_program_is_looked_up_only_where_it_is_allowed() -> None:
    for name, path in module_files(PACKAGE).items():
        for program in looked_up_programs(path):
            assert name in PROGRAMS.get(program, set()), f"{name} looks up {program!r}: allow it in PROGRAMS, or ask" \
                " the module that owns it"


def test_each_package_docstring_names_the_packages_below_it() -> None:
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    for number, layer in enumerate(LAYERS):
        below = {name for lower in LAYERS[number + 1:] for name in lower if name in packages}
        for package in sorted(set(layer) & packages):
            second = (ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text())) or "").splitlines()
            line = next((text for text in second[1:] if text.strip()), "")
            if "every package" in line:
                continue  # the top layers: everything below but the named exceptions
            named = {word.strip(".,;:") for word in line.split()} & packages
            assert named == below, f"agentbox/{package}/__init__.py says it may import {sorted(named)}, the layers " \
                f"below it are {sorted(below)}"


# -- the checker checks --------------------------------------------------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_circle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "low.py": "def f():\n    from pkg import high\n",
        "high.py": "from pkg import low\n",
        "side.py": "from pkg.low import f\n",
    })
    assert cycles(graph(root)) == [["high", "low"]]


def test_an_upward_import_under_type_checking_is_a_violation(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "a/__init__.py": "", "a/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import y\n",
        "b/__init__.py": "", "b/y.py": "from pkg.a import x\n",
        "c/__init__.py": "", "c/z.py": "from ..a.x import *\n",
    })
    layers = [("b",), ("a", "c"), ("__init__",)]
    assert violations(graph(root), layers, set(), {}) == [
        "a.x imports b.y, a layer above it (b over a)",
        "c.z imports a.x, a sibling in its layer (c and a)",
    ]
    assert violations(graph(root), layers, set(), {("a.x", "b.y"): "why", ("c.z", "a.x"): "why"}) == []
    assert violations(graph(root), [("b",), ("a",), ("__init__",)], set(), {}) == [
        "a.x imports b.y, a layer above it (b over a)", "c is in no layer: add it to LAYERS in test_layers.py"]


def test_a_process_start_and_a_program_lookup_are_seen(tmp_path: Path) -> None:
    root = _package(tmp_path, {"quiet.py": "import os\nos.getcwd()\n", "loud.py": "def f():\n    import os\n"
                               "    os.execv('/bin/true', ['true'])\n", "piped.py": "from subprocess import run\n",
                               "finder.py": "from agentbox import hosttools\nhosttools.which('git')\n"})
    assert [p.stem for p in sorted(root.glob("*.py")) if starts_processes(p)] == ["loud", "piped"]
    assert looked_up_programs(root / "finder.py") == {"git"}


# -- the names and the hallways ------------------------------------------------------------------------------

# Imports inside functions, each under a `# deferred: <reason>` line (CONTRIBUTING). Issue 42 added three (the report
# after a plan-path launch's shell; review.patchcheck, only when the instruction list is matched against paths;
# review.instructionimports, only when what the approved instruction files import is worked out again).
MAX_DEFERRED_IMPORTS = 152
MAX_ALIASES = 20
# The launch, decided once (agentbox.session.prepare) and run by the session and task modules: every function there
# takes at most MAX_LAUNCH_PARAMETERS parameters and is at most MAX_LAUNCH_LINES lines long.
LAUNCH_PATH = ("cli.main", "cli.commands.agent", "cli.commands.run", "session.prepare", "session.launch",
               "session.staging", "session.context", "session.warm", "session.brokersetup", "session.checkpointing",
               "session.isolated", "session.detached", "session.bootstrap", "session.setupdigest", "session.guestenv",
               "tasks.submit", "tasks.jobs", "tasks.keeper", "tasks.records", "tasks.hostlogins", "runtime.local",
               "runtime.sshhost", "vm.lifecycle", "credentials.writeback", "session.plan", "session.planned",
               "session.planrecorder", "session.planwrite")
MAX_LAUNCH_PARAMETERS = 6
MAX_LAUNCH_LINES = 60


def deferred_imports(path: Path) -> tuple[int, list[str]]:
    """(how many import statements sit inside a function, those without their reason): a `# deferred: ...` line
    right above the import, or above the first of a run of imports it belongs to."""
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    count, unexplained = 0, []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for body in (getattr(node, field, None) for node in ast.walk(function)
                     for field in ("body", "orelse", "finalbody")):
            if not isinstance(body, list):
                continue
            reason = False
            for statement in body:
                if not isinstance(statement, (ast.Import, ast.ImportFrom)):
                    reason = False
                    continue
                if any(isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)) and inner is not function
                       and statement in ast.walk(inner) for inner in ast.walk(function)):
                    continue  # counted with the innermost function
                count += 1
                above = lines[statement.lineno - 2].strip() if statement.lineno > 1 else ""
                reason = reason or above.startswith("# deferred:")
                if not reason:
                    unexplained.append(f"{path}:{statement.lineno}")
    return count, unexplained


def aliases(path: Path) -> list[str]:
    """`import X as Y` and `from P import X as Y` of agentbox's own modules and names, Y other than X."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agentbox")) or (
                isinstance(node, ast.Import) and any(alias.name.startswith("agentbox") for alias in node.names)):
            found += [f"{alias.name} as {alias.asname}" for alias in node.names
                      if alias.asname and alias.asname != alias.name.rpartition(".")[2]]
    return found


def test_every_import_inside_a_function_says_why_and_they_stay_few() -> None:
    total, unexplained = 0, []
    for path in sorted(PACKAGE.rglob("*.py")):
        count, missing = deferred_imports(path)
        total += count
        unexplained += missing
    assert unexplained == [], "an import inside a function needs a `# deferred: <reason>` line above it"
    assert total <= MAX_DEFERRED_IMPORTS


def test_a_module_is_imported_under_its_own_name() -> None:
    used: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for alias in aliases(path):
            used.setdefault(alias, set()).add(path.name)
    assert {alias: files for alias, files in used.items() if len(files) >= 3} == {}
    assert sum(len(files) for files in used.values()) <= MAX_ALIASES


def test_no_file_name_is_used_twice() -> None:
    seen: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    assert {name: places for name, places in seen.items() if len(places) > 1} == {}


def test_the_launch_path_has_no_long_walks() -> None:
    modules = module_files(PACKAGE)
    too_many, too_long = [], []
    for name in LAUNCH_PATH:
        for node in ast.walk(ast.parse(modules[name].read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if any("click" in ast.unparse(decorator) for decorator in node.decorator_list):
                continue  # a click command's parameters are its command line's options
            arguments = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)
                         if a.arg not in ("self", "cls")]
            if len(arguments) > MAX_LAUNCH_PARAMETERS:
                too_many.append(f"{name}.{node.name}: {len(arguments)}")
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_LAUNCH_LINES:
                too_long.append(f"{name}.{node.name}: {length} lines")
    assert too_many == [] and too_long == []


def test_the_hallway_checks_see_what_they_check(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "a.py": "def f():\n    # deferred: start-up (b is slow)\n    import os\n    import sys\n\n\ndef g():\n"
                "    import json\n",
        "b.py": "from agentbox.vm import lifecycle as vm\nfrom agentbox.git import store\n",
    })
    assert deferred_imports(root / "a.py") == (3, [f"{root / 'a.py'}:8"])
    assert aliases(root / "b.py") == ["lifecycle as vm"]
