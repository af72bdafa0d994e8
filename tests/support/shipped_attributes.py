"""What vllm-mlx's and mlx-lm's modules and classes hold, before and after an engine's seams are put in.

The seam tables' tests (`tests/engine_patch/vllm_mlx/test_*_seams.py`) take a
snapshot of every loaded module and class of both packages, install, and
compare: an attribute replaced that is not a row of the table is a seam
nobody listed. Everything is put back afterwards, whatever the install did.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from collections.abc import Iterator

SHIPPED_PACKAGES = ("vllm_mlx", "mlx_lm")


def shipped_namespaces(*modules: str) -> list[object]:
    """Every module of vllm-mlx and mlx-lm loaded now (after importing `modules`, as a server loads them), and every
    class defined in one."""
    for name in modules:
        importlib.import_module(name)
    loaded = [module for name, module in list(sys.modules.items()) if name.split(".")[0] in SHIPPED_PACKAGES and module is not None]
    classes = [cls for module in loaded for _, cls in inspect.getmembers(module, inspect.isclass) if cls.__module__ == module.__name__]
    return [*loaded, *classes]


def attributes(namespace: object) -> dict[str, object]:
    """A module's or class's attributes but its submodules (an import adds those, no install)."""
    return {name: value for name, value in vars(namespace).items() if not inspect.ismodule(value)}


class Snapshot:
    """The attributes of every namespace given, as they were when taken."""

    def __init__(self, namespaces: list[object]):
        self.held = {id(namespace): (namespace, attributes(namespace)) for namespace in namespaces}

    def replaced(self) -> set[tuple[object, str]]:
        """(namespace, attribute) for every attribute set, added or replaced since; a namespace loaded since (which
        the snapshot cannot vouch for) as (namespace, None)."""
        loaded_since = {(namespace, None) for namespace in shipped_namespaces() if id(namespace) not in self.held}
        return loaded_since | {(namespace, name) for namespace, before in self.held.values()
                               for name, value in attributes(namespace).items() if name not in before or before[name] is not value}

    def before(self, namespace: object, name: str) -> object:
        """What `namespace` held as `name` when taken (a class: its own, or what it inherited then)."""
        for owner in inspect.getmro(namespace) if isinstance(namespace, type) else (namespace,):
            held = self.held.get(id(owner))
            if held is not None and name in held[1]:
                return held[1][name]
        raise KeyError(f"{namespace!r} held no {name!r}")

    def put_back(self) -> None:
        for namespace, before in self.held.values():
            for name in [name for name in attributes(namespace) if name not in before]:
                delattr(namespace, name)
            for name, value in before.items():
                if vars(namespace).get(name) is not value:
                    setattr(namespace, name, value)


@contextlib.contextmanager
def put_back_afterwards(*modules: str) -> Iterator[Snapshot]:
    """A snapshot of vllm-mlx's and mlx-lm's namespaces (`modules` imported first); all put back afterwards."""
    snapshot = Snapshot(shipped_namespaces(*modules))
    try:
        yield snapshot
    finally:
        snapshot.put_back()


def wrapped_in_table_order(table, patches, snapshot: Snapshot) -> list[str]:
    """What is wrong with how `patches` wrapped each attribute, against the table's rows (none: as the table says).

    Each attribute must be given, first, what it held as shipped; each later row what the row before it left; and
    it must hold the last one's replacement now, the rows in the table's order.
    """
    wrong = []
    for target, name in {(patch.target, patch.seam.name) for patch in patches}:
        on_it = [patch for patch in patches if (patch.target, patch.seam.name) == (target, name)]
        label = on_it[0].seam.label
        put_in = [patch.seam.does for patch in on_it]
        if put_in != [seam.does for seam in table if seam.does in put_in]:
            wrong.append(f"{label}: put in out of the table's order")
        if on_it[0].before is not snapshot.before(target, name):
            wrong.append(f"{label}: its first row was not given the attribute as shipped")
        if any(later.before is not earlier.after for earlier, later in zip(on_it, on_it[1:])):
            wrong.append(f"{label}: a row was not given what the row before it left")
        if inspect.getattr_static(target, name) is not on_it[-1].after:
            wrong.append(f"{label}: replaced again outside the table")
    return wrong
