"""Lanes on llama.cpp's slots: each lane's requests pinned to a slot of its own, lanes moved between slots and disk.

    mitmdump -s addons/strip_billing.py ... --set llama_slots=4      (what `stable-prefix up --server llama.cpp` sets)

Off (`llama_slots=0`) unless the upstream is llama.cpp's `llama-server` started with that many slots (`-np`) and a
`--slot-save-path`. For each request the proxy normalized, the lane is named as the diagnosis names it
(`lanes.py`, from the client's body and headers); `slot_lanes.SlotLanes` says which slot it gets and what moves first
(the slot's previous lane saved to its file, the lane's own file or its type's head restored), and the request is
sent with `"id_slot": N`. llama-server reads `id_slot` on /v1/chat/completions and /v1/responses; b11434's
Anthropic endpoint drops it when it converts the body, so on /v1/messages the slot is chosen by llama-server's own
rule, the idle slot sharing the longest prefix with the prompt: the slot the lane's prefix was just restored to.

One request at a time per slot (a save or restore never interleaves with a request on it): a request waits for
its slot to be idle. A save or restore that fails sends the request as it would have gone without this addon
(no `id_slot`), counted and logged; it is never dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
from collections import Counter

from mitmproxy import ctx, exceptions, http

from stable_prefix.addons.flow_notes import FLOW_NOTES, client_headers
from stable_prefix.addons.lanes import LaneNames, lane_signature
from stable_prefix.addons.request_body import write_json_body
from stable_prefix.addons.slot_lanes import SlotLanes, SlotPlan, slot_file

logger = logging.getLogger(__name__)

OPTION = "llama_slots"
FILES_OPTION = "llama_slot_files"
SLOT_ACTION_TIMEOUT_S = 120.0  # a save or restore copies one slot's KV (GBs for a long prompt of a large model)


class SlotActionFailed(Exception):
    """llama-server refused or could not do a slot save or restore."""

    def __init__(self, message: str, missing_file: bool = False) -> None:
        super().__init__(message)
        self.missing_file = missing_file


def slot_action(base_url: str, slot: int, action: str, filename: str) -> dict:
    """`POST /slots/{slot}?action=save|restore` with the file's name (in llama-server's --slot-save-path)."""
    request = urllib.request.Request(f"{base_url}/slots/{slot}?action={action}", data=json.dumps({"filename": filename}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=SLOT_ACTION_TIMEOUT_S) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        detail = error.read().decode("utf-8", "replace")[:300]
        # A restore of a file that is not there: llama-server says it cannot restore (and clears the slot).
        raise SlotActionFailed(f"{action} {filename} on slot {slot}: HTTP {error.code} {detail}",
                               missing_file=action == "restore" and error.code == 400 and "Unable to restore slot" in detail) from error
    except (OSError, ValueError) as error:
        raise SlotActionFailed(f"{action} {filename} on slot {slot}: {error}") from error


class LlamaSlots:
    def __init__(self) -> None:
        self.slots: SlotLanes | None = None
        self.names = LaneNames()
        self.changed: asyncio.Condition | None = None
        self.held: dict[str, SlotPlan] = {}  # flow id -> its plan, until its answer is over
        self.counts: Counter[str] = Counter()  # pinned, saved, restored, cold, unpinned (a failure)
        self.base_url: str | None = None  # llama-server's, as the last request went to it

    def load(self, loader) -> None:
        loader.add_option(OPTION, int, 0, "llama.cpp's slot count (-np): pin each lane to a slot with id_slot, saving and restoring "
                                          "lanes through its --slot-save-path when there are more lanes than slots. 0: off.")
        loader.add_option(FILES_OPTION, bool, True, "With llama_slots: move lanes between slots through slot files. Off for models "
                                                    "whose restored slots llama.cpp prefills again (sliding-window, recurrent): lanes "
                                                    "are then pinned only, and llama.cpp's RAM cache moves them.")

    def configure(self, updated) -> None:
        if OPTION not in updated and FILES_OPTION not in updated:
            return
        count = getattr(ctx.options, OPTION)
        if count < 0:
            raise exceptions.OptionsError(f"{OPTION}={count}: a number of slots (0: off)")
        self.slots = SlotLanes(count, getattr(ctx.options, FILES_OPTION)) if count else None

    async def request(self, flow: http.HTTPFlow) -> None:
        notes = flow.metadata.get(FLOW_NOTES)
        if self.slots is None or flow.response or flow.error or not flow.live or not notes or "client_body" not in notes:
            return
        lane = self.names.name_for(lane_signature(json.loads(notes["client_body"]), notes["api"], client_headers(flow)))
        if self.changed is None:
            self.changed = asyncio.Condition()
        async with self.changed:
            while (plan := self.slots.plan(lane)) is None:
                await self.changed.wait()
        self.held[flow.id] = plan
        self.base_url = base_url = f"{flow.request.scheme}://{flow.request.host}:{flow.request.port}"
        try:
            moved = await self._move(base_url, plan)
        except SlotActionFailed as error:
            self.counts["unpinned"] += 1
            self.slots.lost(plan.slot)
            logger.warning(f"{OPTION}: lane {lane}: {error}; the request goes without a slot, as it would without this addon "
                           f"({self.counts['unpinned']} so far)")
            notes["llama_slot"] = {"lane": lane, "unpinned": str(error)}
            return
        try:
            body = json.loads(flow.request.get_content(strict=False) or b"")
        except ValueError:  # another addon's body; llama-server's own choice of slot for it
            return
        if not isinstance(body, dict):
            return
        body["id_slot"] = plan.slot
        write_json_body(flow.request, body)
        self.counts["pinned"] += 1
        notes["llama_slot"] = {"lane": lane, "slot": plan.slot, **moved}

    async def _move(self, base_url: str, plan: SlotPlan) -> dict:
        """The plan's saves and restore, in order, each a blocking HTTP call in a thread (the bookkeeping stays in the
        event loop's); what moved, for the flow's notes."""
        moved: dict[str, object] = {}
        if plan.save:
            lane, file = plan.save
            await asyncio.to_thread(slot_action, base_url, plan.slot, "save", file)
            self.slots.saved_to(lane, file)
            self.counts["saved"] += 1
            moved["saved"] = lane
        if plan.head:
            slot, lane, file = plan.head
            await asyncio.to_thread(slot_action, base_url, slot, "save", file)
            self.slots.saved_to(lane, file)
            self.counts["saved"] += 1
            moved["head_from"] = lane
        if plan.restore:
            try:
                restored = await asyncio.to_thread(slot_action, base_url, plan.slot, "restore", plan.restore)
            except SlotActionFailed as error:
                if not (plan.restore_may_be_missing and error.missing_file):
                    raise
                self.counts["cold"] += 1  # no file from an earlier run: the lane starts in an empty slot
            else:
                self.counts["restored"] += 1
                moved.update(restored=plan.restore, restored_tokens=restored.get("n_restored"))
        return moved

    async def response(self, flow: http.HTTPFlow) -> None:
        await self._release(flow)

    async def error(self, flow: http.HTTPFlow) -> None:
        await self._release(flow)

    async def _release(self, flow: http.HTTPFlow) -> None:
        plan = self.held.pop(flow.id, None)
        if plan is None or self.slots is None or self.changed is None:
            return
        async with self.changed:
            self.slots.release(plan)
            self.changed.notify_all()

    def done(self) -> None:
        """The proxy stops (`up` stops it before the server): each lane still in a slot is saved, so that a stack
        started again finds every lane warm, not only those that had been moved out."""
        if self.slots is not None and self.slots.files and self.base_url:
            for slot, lane in enumerate(self.slots.owner):
                if lane is not None and not self.slots.busy[slot]:
                    try:
                        slot_action(self.base_url, slot, "save", slot_file(lane))
                        self.counts["saved"] += 1
                    except SlotActionFailed as error:
                        logger.warning(f"{OPTION}: lane {lane} not saved as the proxy stops: {error}")
        if self.counts:
            logger.info(f"{OPTION}: " + ", ".join(f"{name} {count}" for name, count in sorted(self.counts.items())))


addons = [LlamaSlots()]
