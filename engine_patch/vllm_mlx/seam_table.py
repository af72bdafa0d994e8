"""What a seam table is and how it is put in, for both engines' tables (`simple/seams.py`, `batched/seams.py`).

A row (`Seam`) names one attribute of vllm-mlx's or mlx-lm's by reference
(the method or function as shipped: the attribute replaced is its name), the
wrapper put around it, and why. `put_in` applies rows top to bottom; a row on
an attribute an earlier row already wrapped is given that wrapper, so it wraps
it and runs first: the order of wrappers is the table's. Each replacement is
recorded (`Patch`): the log names what was patched, a test checks that
nothing is patched outside the table and in no other order, and `take_out`
puts every attribute back.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class Seam:
    """One attribute of vllm-mlx's or mlx-lm's that an engine wraps, with what runs around it and why."""

    owner: Any  # the class or module whose attribute is replaced
    shipped: Callable[..., Any]  # the attribute as shipped, by reference: the attribute replaced is its name
    # run_by None: the attribute there now -> its replacement (itself: already in, left as it is).
    # Else a method of `run_by`, given the object's method there now and the call's arguments.
    wrap: Callable[..., Any]
    does: str
    # None: put on the owner itself at install. Else: on each object of the owner (a generator) one of
    # these attaches, which runs `wrap`: a seam per object leaves the class as shipped for everyone else.
    run_by: type | None = None
    needs: str | None = None  # a module the wrapper imports; a release without it keeps this attribute as shipped

    @property
    def name(self) -> str:
        return self.shipped.__name__

    @property
    def label(self) -> str:
        return f"{self.owner.__name__}.{self.name}"

    def available(self) -> bool:
        try:
            if self.needs is not None:
                importlib.import_module(self.needs)
        except ImportError:
            return False
        return True


@dataclass(frozen=True)
class Patch:
    """One attribute a row replaced: what it held before (as stored) and after."""

    seam: Seam
    target: Any  # the owner, or the object of the owner's class the row was put on
    before: Any
    after: Any
    inherited: bool  # the target held no attribute of its own before (a method of its class): taken out, not set back


def where_present(module: str, rows: Callable[[ModuleType], Iterable[Seam]]) -> tuple[Seam, ...]:
    """`rows(module)`, or none on a release that lacks the module or a method they name (that part runs as shipped)."""
    try:
        return tuple(rows(importlib.import_module(module)))
    except (ImportError, AttributeError):
        return ()


def put_in(rows: Iterable[Seam]) -> list[Patch]:
    """The rows run by no object (`run_by` None), each on its owner, top to bottom; what was replaced."""
    return [patch for seam in rows if seam.run_by is None and seam.available()
            for patch in _replace(seam, seam.owner, seam.wrap)]


def put_on_objects(rows: Iterable[Seam], objects: Iterable[Any], runners: dict[type, Any]) -> list[Patch]:
    """The rows run by an object, top to bottom: each on the one of `objects` that is of its owner's class, run by
    `runners[run_by]` (a row whose runner is None is left out); what was replaced."""
    objects = list(objects)
    patches = []
    for seam in rows:
        runner = runners.get(seam.run_by) if seam.run_by is not None else None
        if runner is None or not seam.available():
            continue
        target = next(obj for obj in objects if isinstance(obj, seam.owner))
        patches += _replace(seam, target, lambda method, seam=seam, runner=runner: functools.partial(seam.wrap, runner, method))
    return patches


def take_out(patches: Iterable[Patch]) -> None:
    """Every attribute `patches` replaced as it was before them, the last one first."""
    for patch in reversed(list(patches)):
        if patch.inherited:
            delattr(patch.target, patch.seam.name)
        else:
            setattr(patch.target, patch.seam.name, patch.before)


def labels(patches: Iterable[Patch]) -> list[str]:
    """What was patched, each attribute once, in the order first patched (for the install's log line)."""
    return list(dict.fromkeys(patch.seam.label for patch in patches))


def _replace(seam: Seam, target: Any, wrap: Callable[[Any], Any]) -> list[Patch]:
    before = stored(target, seam.name)
    after = wrap(before)
    if after is before:
        return []
    inherited = seam.name not in vars(target)
    setattr(target, seam.name, after)
    return [Patch(seam, target, before, after, inherited)]


def stored(target: Any, name: str) -> Any:
    """On a class, the attribute as stored (a classmethod stays one, so its replacement can be one); on a module
    or an object, as read (a method bound to the object)."""
    return inspect.getattr_static(target, name) if isinstance(target, type) else getattr(target, name)
