"""Fuzz, in process: bodies of every protocol through strip_billing and capture's hooks.

Property (tests/support/forwarding_property.py): what is forwarded is the
client's body byte for byte, or that body after the documented rules; a body
the proxy cannot read (tests/support/fuzz_bodies.py: DEFECTS, a content type
or content-encoding it does not read) passes untouched and is logged once;
the addons never raise, and every request leaves one capture record, valid
UTF-8 JSON, and no temporary file. `FUZZ_SCALE=20` runs twenty times the
examples (the soak's run); the counts are printed at the end (`pytest -s`).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.support.addon_pipeline import MAX_TOKENS_CAP, SERVED_MODEL, AddonPipeline, addon_pipeline
from tests.support.forwarding_property import exchange_problems
from tests.support.fuzz_bodies import PROTOCOLS, WireRequest, fuzz

EXAMPLES = {"anthropic": 400, "openai": 400, "responses": 200}
TALLY: Counter = Counter()


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    with addon_pipeline(tmp_path_factory.mktemp("captures")) as pipeline:
        yield pipeline
    print("\nin-process fuzz examples: " + ", ".join(f"{key} {count}" for key, count in sorted(TALLY.items())))


def outcome(wire: WireRequest, forwarded: bytes) -> str:
    if wire.defect is not None:
        return "unreadable"
    return "changed by the rules" if forwarded != wire.content else "byte for byte"


def check(pipeline: AddonPipeline, wire: WireRequest) -> None:
    path = wire.protocol.path
    result = pipeline.send(path, wire.content, list(wire.headers), wire.chunked)
    forwarded = result.request.raw_content
    assert exchange_problems(wire, forwarded, result.request.headers, served_model=SERVED_MODEL, max_tokens_cap=MAX_TOKENS_CAP) == []
    if wire.protocol.normalized and wire.defect is not None:
        [warning] = result.warnings
        assert warning.startswith(f"POST {path}: ") and warning.endswith("; passed through unchanged")
    elif result.warnings:
        # Valid JSON in a shape the rules do not read (a Responses body without `input`): untouched, said once.
        [warning] = result.warnings
        assert warning.startswith(f"POST {path}: ") and warning.endswith("; passed through unchanged")
        assert forwarded == wire.content
    if wire.protocol.normalized:
        [record_path] = result.records
        record = json.loads(record_path.read_bytes().decode("utf-8"))  # strict: valid UTF-8, valid JSON
        assert "client_body" in record if wire.defect is None else {"client_body", "client_body_text"} & set(record)
    else:
        assert result.records == []
    assert result.leftovers == []
    TALLY[f"{wire.protocol.name} {outcome(wire, forwarded)}"] += 1


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_every_body_is_forwarded_as_sent_or_as_the_rules_say_and_nothing_crashes(pipeline, name):
    fuzz(PROTOCOLS[name], EXAMPLES[name], lambda wire: check(pipeline, wire))
