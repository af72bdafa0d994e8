"""engine_patch/'s rooms import one way: the cache core and drafting know no disk, no HTTP side and no engine; read from the source, nothing imported."""

import ast
from pathlib import Path

import pytest

from tests.support import imports
from tests.support.imports import package_of, within
from tests.support.processes import REPO_ROOT

ENGINE_PATCH = REPO_ROOT / "engine_patch"
PACKAGE = "stable_prefix.engine_patch"
# Lowest first: a room may import its own modules and those of rooms before it, never one after it.
ROOMS = ("cache", "drafts", "disk", "http_api", "vllm_mlx", "")
# Engine attachments are peers: neither knows the other.
PEERS = ("vllm_mlx.simple", "vllm_mlx.batched")


def imported_modules(path: Path, source: str | None = None) -> set[str]:
    """Every stable_prefix.engine_patch... name a module (its file, or source standing in for it) imports."""
    return within(imports.imported_modules(path, source), PACKAGE)


def room_of(dotted: str) -> str:
    """The room a dotted name under engine_patch belongs to ("" for the top: install, __main__, defaults)."""
    inside = dotted.removeprefix(PACKAGE).lstrip(".")
    first = inside.split(".")[0]
    return first if first in ROOMS else ""


def rank(room: str) -> int:
    return ROOMS.index(room)


def module_name(path: Path) -> str:
    return f"{package_of(path)}.{path.stem}"


MODULES = sorted(ENGINE_PATCH.rglob("*.py"))


def test_every_room_the_rule_names_is_a_folder_with_its_own_docstring():
    for room in (*ROOMS[:-1], *PEERS):
        init = ENGINE_PATCH.joinpath(*room.split(".")) / "__init__.py"
        assert init.is_file(), f"{room}/ is not a package"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{room}/__init__.py says nothing of what lives there"


def test_no_module_sits_in_a_folder_the_rule_does_not_know():
    known = {f"{PACKAGE}.{room}".rstrip(".") for room in (*ROOMS, *PEERS)}
    strays = [str(path.relative_to(REPO_ROOT)) for path in MODULES if package_of(path) not in known]
    assert not strays, f"modules in a folder with no place in ROOMS/PEERS: {strays}"


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(ENGINE_PATCH)))
def test_a_module_imports_no_room_above_its_own(path):
    own = room_of(module_name(path))
    upward = sorted(name for name in imported_modules(path) if rank(room_of(name)) > rank(own))
    assert not upward, f"{path.relative_to(REPO_ROOT)} ({own or 'top'}) imports a higher room: {upward}"


@pytest.mark.parametrize("path", [path for path in MODULES if package_of(path).endswith(PEERS)],
                         ids=lambda path: str(path.relative_to(ENGINE_PATCH)))
def test_an_engine_attachment_imports_no_other_engines_attachment(path):
    own = package_of(path)
    others = [f"{PACKAGE}.{peer}" for peer in PEERS if f"{PACKAGE}.{peer}" != own]
    crossing = sorted(name for name in imported_modules(path) if name.startswith(tuple(others)))
    assert not crossing, f"{path.relative_to(REPO_ROOT)} imports another engine's attachment: {crossing}"


def test_the_reader_catches_an_upward_import_written_either_way():
    # The rule has teeth: a core module importing the batched engine, absolutely or relatively, is seen.
    core = ENGINE_PATCH / "cache" / "ram_tier.py"
    source = core.read_text() + "\nfrom stable_prefix.engine_patch.vllm_mlx.batched import batched_engine\nfrom ..http_api.admission import admit_prompt\n"
    upward = {room_of(name) for name in imported_modules(core, source)} - {"cache"}
    assert upward == {"vllm_mlx", "http_api"}
