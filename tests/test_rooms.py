# The rooms of the house (../shared/DESIGN.md, README's room map): each folder imports only the
# rooms below it, so the folder-level import graph has no cycle; api/ and workers/ never import
# each other (what both need is in service/); nothing imports the CLI (fleetlm/); the engine and
# the kernels import no service room; the API reaches no torch. Imports are read with `ast` from
# every module of the tree, imports inside functions included (a lazy import is still an arrow),
# `if TYPE_CHECKING:` blocks left out (they never run).
from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# From the bottom of the house up; a room may import itself and the rooms named here.
MAY_IMPORT: dict[str, set[str]] = {
    "kernels": set(),
    "engine": {"kernels"},
    "metering": set(),
    "migrations": {"metering"},
    "service": {"metering", "engine"},  # engine: TORCH_FREE_ENGINE only
    "api": {"service", "metering", "engine"},  # engine: engine.tokenizer only
    "workers": {"service", "metering", "engine"},
    "fleetlm": {"kernels", "engine", "metering", "migrations", "service", "api", "workers"},
}
ROOMS = tuple(MAY_IMPORT)
# The engine modules a service process may load without torch (the API tokenizes with the
# first; the settings derive the engine's config and context length from the next two; the
# router hashes prompt blocks as the prefix cache does with the fourth; requests carry sampling
# params, and the API compiles their grammars to check them, with the last two; every room
# names a request's priority with engine.priority, and its usage with engine.usage).
TORCH_FREE_ENGINE = {
    "engine.priority",
    "engine.usage",
    "engine.tokenizer",
    "engine.config",
    "engine.models.config",
    "engine.block_hash",
    "engine.sampling_params",
    "engine.grammar",
}
HEAVY = {"torch", "triton", "kernels"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for room in ROOMS
        for path in sorted((ROOT / room).rglob("*.py"))
        if ".venv" not in path.parts
    }


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST):
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
            else:
                stack.append(child)


@cache
def imports_of(module: str) -> frozenset[str]:
    """Every module `module` imports: repo modules by full name (a `from pkg import mod` names
    pkg.mod), anything else by its top-level package."""
    known = modules()
    path = known[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, `level` - 1 packages up
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        found |= {name if room_of(name) else name.split(".")[0] for name in targets}
    found.discard(module)
    return frozenset(found)


def room_of(module: str) -> str | None:
    top = module.split(".")[0]
    return top if top in ROOMS else None


def _closure(start: set[str]) -> set[str]:
    """What importing `start` loads: repo modules followed transitively, with each module's
    parent packages (importing a.b runs a/__init__.py first)."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if module in modules():
            parents = module.split(".")
            todo += [".".join(parents[:i]) for i in range(1, len(parents))]
            todo += imports_of(module)
    return seen


def test_each_room_imports_only_the_rooms_below_it():
    crossings = [
        f"{module} imports {imported}"
        for module in modules()
        for imported in imports_of(module)
        if (target := room_of(imported)) is not None
        and target != room_of(module)
        and target not in MAY_IMPORT[room_of(module)]
    ]
    assert not crossings, "rooms crossed (see DESIGN.md's room table):\n" + "\n".join(crossings)


def test_the_folder_import_graph_has_no_cycle():
    edges: dict[str, set[str]] = {room: set() for room in ROOMS}
    for module in modules():
        for imported in imports_of(module):
            target = room_of(imported)
            if target is not None and target != room_of(module):
                edges[room_of(module)].add(target)

    def cycle_from(room: str, path: list[str]) -> list[str] | None:
        if room in path:
            return [*path[path.index(room) :], room]
        for target in sorted(edges[room]):
            found = cycle_from(target, [*path, room])
            if found:
                return found
        return None

    for room in ROOMS:
        cycle = cycle_from(room, [])
        assert cycle is None, " → ".join(cycle)


def test_api_and_workers_never_import_each_other_nor_the_cli():
    for module in modules():
        room = room_of(module)
        forbidden = {"fleetlm"} if room != "fleetlm" else set()
        forbidden |= {"api": {"workers"}, "workers": {"api"}}.get(room, set())
        bad = sorted(i for i in imports_of(module) if room_of(i) in forbidden)
        assert not bad, f"{module} imports {bad}"


def test_engine_and_kernels_import_no_service_room():
    service_rooms = {"metering", "migrations", "service", "api", "workers", "fleetlm"}
    for module in modules():
        if room_of(module) in ("engine", "kernels"):
            bad = sorted(i for i in imports_of(module) if room_of(i) in service_rooms)
            assert not bad, f"{module} imports {bad}"


def test_the_api_reaches_the_engine_only_through_torch_free_modules():
    for module in modules():
        engine = {i for i in imports_of(module) if room_of(i) == "engine"}
        if room_of(module) == "api":
            assert engine <= {"engine", "engine.tokenizer"}, f"{module} imports {engine}"
        if room_of(module) == "service":
            assert engine <= {"engine", *TORCH_FREE_ENGINE}, f"{module} imports {engine}"
    api = {m for m in modules() if room_of(m) == "api"}
    loaded = _closure(api)
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert not heavy, f"importing api/ loads {heavy}"
    packages = {m for m, path in modules().items() if path.name == "__init__.py"}
    engine = {m for m in loaded if room_of(m) == "engine"} - packages
    assert engine <= TORCH_FREE_ENGINE, f"importing api/ loads {sorted(engine)}"


def test_the_checker_sees_imports_inside_functions_and_skips_type_checking_blocks():
    # Ground truth for the checker itself, on modules whose imports are known.
    assert "engine.config" in imports_of("service.settings")  # inside engine_config()
    assert not {i for i in imports_of("engine") if room_of(i) == "engine"}  # TYPE_CHECKING only
    assert "torch" in imports_of("engine.runner.model_runner")


def _string_constants(module: str) -> list[str]:
    tree = ast.parse(modules()[module].read_text())
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_metering_keeps_to_postgres_and_the_record_codec():
    # The Redis half of the tenant limits is service/limit_reservations.py; the stream metering
    # reads is named in metering/records.py, but the client is handed in by who runs it.
    for module in modules():
        if room_of(module) == "metering":
            assert "redis" not in imports_of(module), f"{module} imports redis"


# Redis keys and Lua with one owner each: the literal that builds or reads them appears in no
# other module, so nobody else can build those keys or read the pending lists by hand.
OWNED_LITERALS = {
    "fleetlm:limit:": "service.limit_reservations",
    "'XPENDING'": "service.queue_ownership",
}


def test_rate_limit_keys_and_queue_ownership_reads_have_one_owner():
    for literal, owner in OWNED_LITERALS.items():
        holders = sorted(
            module
            for module in modules()
            if any(literal in text for text in _string_constants(module))
        )
        assert holders == [owner], f"{literal!r} is written in {holders}, only {owner} may"


def _classes(room: str) -> dict[str, ast.ClassDef]:
    return {
        f"{module}.{node.name}": node
        for module, path in modules().items()
        if room_of(module) == room
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }


def test_the_gpu_worker_is_composed_of_its_parts_not_mixed_in():
    # The worker holds the objects it owns (round trip, admission, request ends, lease watch),
    # each built with what it needs; no class of workers/ is another's base.
    classes = _classes("workers")
    (worker,) = [node for name, node in classes.items() if name.endswith(".GpuWorker")]
    assert not worker.bases, f"GpuWorker derives from {[ast.unparse(b) for b in worker.bases]}"
    ours = {name.rpartition(".")[2] for name in classes}
    mixed = sorted(
        f"{name} derives from {ast.unparse(base)}"
        for name, node in classes.items()
        for base in node.bases
        if ast.unparse(base).rpartition(".")[2] in ours
    )
    assert not mixed, "\n".join(mixed)


def test_the_workers_wings_do_not_import_each_other():
    # workers/gpu/ (the GPU worker) and workers/batch/ (the batch runner and its Celery tasks) run
    # in different processes; what both would need goes at workers/' top.
    wings = {"workers.gpu", "workers.batch"}
    for module in modules():
        wing = next((w for w in wings if module.startswith(w + ".")), None)
        if wing is None:
            continue
        bad = sorted(
            i for i in imports_of(module) for other in wings - {wing} if i.startswith(other)
        )
        assert not bad, f"{module} imports {bad}"
