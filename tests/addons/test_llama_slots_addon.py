"""addons/llama_slots.py in process (mitmproxy's test context, no server): its options, and the slot each lane's body names."""

import asyncio
import json

import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons

from stable_prefix.addons.llama_slots import LlamaSlots
from stable_prefix.servers import REPO_ROOT
from tests.fixtures import claude_code
from tests.support.messages_flows import api_flow
from tests.support.proxy_addons import ProxyAddons


def forwarded_slots(*requests: tuple[dict, dict | None], slots: int = 2) -> list[int | None]:
    """Each request through ProxyAddons and LlamaSlots (slot files off: nothing to call), answered in turn: the
    `id_slot` its forwarded body names."""
    strip, lanes = ProxyAddons(), LlamaSlots()
    with taddons.context(strip, lanes) as tctx:
        tctx.configure(lanes, llama_slots=slots, llama_slot_files=False)

        async def send_all() -> list[int | None]:
            named = []
            for body, headers in requests:
                flow = api_flow(body)
                flow.request.headers.update(headers or {})
                strip.request(flow)
                await lanes.request(flow)
                named.append(json.loads(flow.request.content).get("id_slot"))
                await lanes.response(flow)
            return named

        return asyncio.run(send_all())


def test_each_lane_is_pinned_to_a_slot_of_its_own_and_keeps_it():
    main, sub = (claude_code.main_request(2), None), (claude_code.subagent_request("explore"), claude_code.agent_headers("1c1c1c1c1c1c"))
    assert forwarded_slots(main, sub, (claude_code.main_request(3), None)) == [1, 0, 1]


def test_a_third_lane_takes_the_least_recently_used_lanes_slot():
    main, sub = (claude_code.main_request(2), None), (claude_code.subagent_request("explore"), claude_code.agent_headers("1c1c1c1c1c1c"))
    assert forwarded_slots(main, sub, (claude_code.title_request(), None)) == [1, 0, 1]


def test_off_by_default_nothing_is_pinned():
    assert forwarded_slots((claude_code.main_request(2), None), slots=0) == [None]


def test_a_negative_slot_count_is_refused_naming_the_option():
    addon = LlamaSlots()
    with taddons.context(addon) as tctx, pytest.raises(exceptions.OptionsError, match="llama_slots=-1"):
        tctx.configure(addon, llama_slots=-1)


def test_the_proxy_script_carries_the_slot_lanes():
    with taddons.context() as tctx:
        tctx.script(str(REPO_ROOT / "addons" / "strip_billing.py"))
        assert "llama_slots" in tctx.options and tctx.options.llama_slots == 0
