"""Which llama.cpp slot a lane uses, and what moves between slots and disk so that it finds its prefix there.

llama-server keeps one prompt's KV per slot (`-np N`). With more lanes than slots (the main agent, each subagent
instance, the title requests), a lane that comes back finds its slot taken by another one and prefills its whole
prompt again. `SlotLanes` gives each lane a slot of its own while there are slots, then the least recently used
lane's: that lane is saved to a file first (llama-server's `POST /slots/ID?action=save`), and a lane that had been
saved is restored into its new slot (`action=restore`). A subagent instance seen for the first time starts from
its type's head: the slot or file of another instance of its type (`lanes.lane_group`), saved first where it is
live in a slot (or kept where the slot it takes is that instance's). A lane seen for the first time by this proxy may have a file from an earlier run (llama-server's
slot files outlive it): it is tried, and a missing one only means a cold start.

One request at a time per slot: a slot taken for a request is busy until its answer is over, and a save or
restore is only planned on an idle slot, so neither ever interleaves with a request on it. `plan()` returns None
when the lane must wait (its slot, or every slot, is busy); the addon waits for `release()` and asks again.

Without files (`files=False`: a sliding-window or recurrent model, whose restored slot llama.cpp prefills again), lanes
are only pinned: a lane without a slot takes the least recently used one, and llama-server's own RAM cache moves the
prompts (it keeps their checkpoints).

Plain bookkeeping, no I/O: `addons/llama_slots.py` does the HTTP calls and tells it what failed.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from stable_prefix.addons.lanes import lane_group

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")  # llama-server refuses other characters in a slot file's name


def slot_file(lane: str) -> str:
    """A lane's slot file name: readable, unique (a hash of the whole name), one llama-server accepts."""
    readable = _UNSAFE.sub("_", lane).strip("._-")[:40] or "lane"
    return f"{readable}-{hashlib.sha256(lane.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}.bin"


@dataclass(frozen=True)
class SlotPlan:
    """What to do before `lane`'s request is sent pinned to `slot` (steps in this order; None: nothing)."""

    lane: str
    slot: int
    save: tuple[str, str] | None = None  # (lane, file): the slot's previous lane, saved before it is overwritten
    head: tuple[int, str, str] | None = None  # (slot, lane, file): a live peer instance's slot, saved for its type's head
    restore: str | None = None  # the file `lane` starts from: its own, or its type's head
    restore_may_be_missing: bool = False  # a file from an earlier run, perhaps never written: its absence is a cold start

    @property
    def slots(self) -> tuple[int, ...]:
        """The slots this plan holds busy until `release`."""
        return (self.slot,) + ((self.head[0],) if self.head else ())


class SlotLanes:
    def __init__(self, slots: int, files: bool = True) -> None:
        if slots <= 0:
            raise ValueError(f"{slots} slots: llama-server has at least one")
        self.files = files
        self.owner: list[str | None] = [None] * slots  # the lane whose KV a slot holds (None: none, or not known)
        self.busy: list[bool] = [False] * slots
        self.last_use: list[int] = [-1] * slots  # when its last request ended (-1: never), as llama-server's t_last_used
        self.saved: dict[str, str] = {}  # lane -> its file on disk, oldest first (a save moves it last)
        self.seen: set[str] = set()  # lanes this proxy has planned for
        self._clock = 0

    def slot_of(self, lane: str) -> int | None:
        return self.owner.index(lane) if lane in self.owner else None

    def plan(self, lane: str) -> SlotPlan | None:
        """The slot for `lane`'s request and what moves first; marks the slots busy. None: wait for a release."""
        own = self.slot_of(lane)
        if own is not None:
            if self.busy[own]:
                return None
            return self._take(SlotPlan(lane, own))
        idle = [slot for slot in range(len(self.owner)) if not self.busy[slot]]
        if not idle:
            return None
        # The least recently used, the highest number first among equals: llama-server's own choice for a prompt that
        # shares too little with every slot, which is all it has on /v1/messages (where it drops id_slot).
        slot = min(idle, key=lambda slot: (self.last_use[slot], -slot))
        previous = self.owner[slot]
        if not self.files:
            return self._take(SlotPlan(lane, slot))
        save = (previous, slot_file(previous)) if previous is not None else None
        head, restore, may_be_missing = None, self.saved.get(lane), False
        if restore is None and previous is not None and self._is_peer(previous, lane):
            pass  # the slot holds another instance of the lane's type: its head is there already
        elif restore is None and lane not in self.seen:
            head, restore = self._head_of(lane, slot)
            if restore is None:
                restore, may_be_missing = slot_file(lane), True
        return self._take(SlotPlan(lane, slot, save, head, restore, may_be_missing))

    @staticmethod
    def _is_peer(other: str, lane: str) -> bool:
        """Another instance of `lane`'s subagent type."""
        return other != lane and lane_group(other) == lane_group(lane) != lane

    def _head_of(self, lane: str, slot: int) -> tuple[tuple[int, str, str] | None, str | None]:
        """Where a new instance's type head is: a peer's idle slot (saved first), else the newest peer file."""
        for peer_slot, peer in enumerate(self.owner):
            if peer_slot != slot and peer is not None and self._is_peer(peer, lane) and not self.busy[peer_slot]:
                return (peer_slot, peer, slot_file(peer)), slot_file(peer)
        peers = [file for peer, file in self.saved.items() if self._is_peer(peer, lane)]
        return None, (peers[-1] if peers else None)

    def _take(self, plan: SlotPlan) -> SlotPlan:
        for slot in plan.slots:
            self.busy[slot] = True
        self.seen.add(plan.lane)
        self.owner[plan.slot] = plan.lane
        return plan

    def saved_to(self, lane: str, file: str) -> None:
        """A save went through: `lane` can come back from `file`."""
        self.saved.pop(lane, None)
        self.saved[lane] = file

    def lost(self, slot: int) -> None:
        """A save or restore on `slot` failed: what it holds is not known (the next lane on it prefills)."""
        self.owner[slot] = None

    def release(self, plan: SlotPlan) -> None:
        """The plan's request is over (answered, failed or sent unpinned)."""
        self._clock += 1
        for slot in plan.slots:
            self.busy[slot] = False
        self.last_use[plan.slot] = self._clock
