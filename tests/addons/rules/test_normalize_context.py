"""The rules that put stable context first: git status relocation, initial
context before the first user message, empty system messages; and the
determinism every rule owes a prefix cache (same earlier messages, same
bytes, on every later turn)."""

import copy

import pytest

from stable_prefix.addons import normalize
from stable_prefix.addons.normalize import Rules
from stable_prefix.addons.prompt_order import canonical_value, compare, prompt_order
from stable_prefix.addons.rules import git_status, initial_context, system_messages
from stable_prefix.addons.rules.base import Change
from tests.fixtures import claude_code

REMINDER = "<system-reminder>\n{}\n</system-reminder>"
GIT_STATUS = "gitStatus: Current branch: main\nStatus:\nM src/app.py"


def forwarded(body, api="anthropic", rules=Rules()):
    body = copy.deepcopy(body)
    normalize.normalize(body, api, rules)
    return body


def order(body, api="anthropic", rules=Rules()):
    return prompt_order(forwarded(body, api, rules), api)


def text_block(text):
    return {"type": "text", "text": text}


# --- git status paragraph (releases that send it in the system prompt) ---------------------------------


def test_git_status_paragraph_moves_verbatim_to_the_start_of_the_first_user_message():
    body = claude_code.main_request(3)
    paragraph = body["system"][2]["text"][body["system"][2]["text"].index("gitStatus:") :]
    changes = git_status.relocate_git_status(body, "anthropic")
    assert "gitStatus" not in body["system"][2]["text"] and body["system"][2]["text"].endswith("Today's date is 2026-11-30.")
    assert body["messages"][0]["content"][0] == text_block(REMINDER.format(paragraph))
    assert body["messages"][0]["content"][1]["text"] == "Please look at the failing test."
    assert changes == [Change("git_status", "system[2]", "git status paragraph taken out"),
                       Change("git_status", "messages[0]", "git status paragraph put first, in a <system-reminder>")]


def test_git_status_in_a_system_string_moves_and_a_string_first_message_becomes_blocks():
    body = {"system": f"You help.\n\n{GIT_STATUS}", "messages": [{"role": "user", "content": "hi"}]}
    git_status.relocate_git_status(body, "anthropic")
    assert body == {"system": "You help.", "messages": [{"role": "user", "content": [text_block(REMINDER.format(GIT_STATUS)), text_block("hi")]}]}


def test_the_first_message_reads_the_same_as_a_string_or_as_a_marked_block_list():
    as_string = {"system": GIT_STATUS + "\n", "messages": [{"role": "user", "content": "hi"}]}
    as_blocks = {"system": GIT_STATUS + "\n", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]}
    for body in (as_string, as_blocks):
        git_status.relocate_git_status(body, "anthropic")
    assert canonical_value(as_string) == canonical_value(as_blocks)


def test_a_system_block_holding_only_the_git_status_is_removed():
    body = {"system": [text_block("You help."), text_block(GIT_STATUS)], "messages": [{"role": "user", "content": "hi"}]}
    git_status.relocate_git_status(body, "anthropic")
    assert body["system"] == [text_block("You help.")]


def test_a_system_prompt_without_git_status_is_left_alone():
    body = claude_code.modern_request(2)
    before = copy.deepcopy(body)
    assert git_status.relocate_git_status(body, "anthropic") == [] and body == before


def test_git_status_mentioned_inside_a_line_is_not_a_paragraph():
    body = {"system": "Look at the gitStatus: line in the first message.", "messages": [{"role": "user", "content": "hi"}]}
    assert git_status.relocate_git_status(body, "anthropic") == []


def test_two_git_status_paragraphs_both_move_in_their_order():
    body = {"system": [text_block(f"A.\n{GIT_STATUS}"), text_block("gitStatus: second")], "messages": [{"role": "user", "content": "hi"}]}
    git_status.relocate_git_status(body, "anthropic")
    assert [block["text"] for block in body["messages"][0]["content"]] == [REMINDER.format(GIT_STATUS), REMINDER.format("gitStatus: second"), "hi"]


@pytest.mark.parametrize("messages", [[], [{"role": "assistant", "content": "only me"}], None])
def test_without_a_user_message_the_git_status_stays_in_the_system_prompt(messages):
    body = {"system": f"You help.\n{GIT_STATUS}", "messages": messages}
    before = copy.deepcopy(body)
    assert git_status.relocate_git_status(body, "anthropic") == [] and body == before


def test_a_first_message_that_already_starts_with_a_reminder_gets_the_git_status_before_it():
    body = {"system": GIT_STATUS, "messages": [{"role": "user", "content": [text_block(REMINDER.format("an earlier reminder")), text_block("hi")]}]}
    git_status.relocate_git_status(body, "anthropic")
    assert [block["text"] for block in body["messages"][0]["content"]] == [REMINDER.format(GIT_STATUS), REMINDER.format("an earlier reminder"), "hi"]


def test_openai_git_status_moves_from_the_system_message_to_the_first_user_message():
    body = claude_code.openai_request(2)
    body["messages"][0]["content"] += "\n" + GIT_STATUS
    git_status.relocate_git_status(body, "openai")
    assert "gitStatus" not in body["messages"][0]["content"] and body["messages"][0]["role"] == "system"
    assert body["messages"][1]["content"] == [text_block(REMINDER.format(GIT_STATUS)), text_block("Please look at the failing test.")]


def test_openai_system_message_holding_only_the_git_status_is_removed():
    body = {"messages": [{"role": "system", "content": "You help."}, {"role": "system", "content": GIT_STATUS}, {"role": "user", "content": "hi"}]}
    git_status.relocate_git_status(body, "openai")
    assert body["messages"] == [{"role": "system", "content": "You help."}, {"role": "user", "content": [text_block(REMINDER.format(GIT_STATUS)), text_block("hi")]}]


def test_after_clear_in_the_same_repository_system_and_tools_stay_and_the_break_moves_into_the_first_message():
    before, after = claude_code.main_request(6), claude_code.main_request(1, git_status="?? notes.txt", topic="other work")
    as_today = compare(order(before, rules=Rules(relocate_git_status=False)), order(after, rules=Rules(relocate_git_status=False)))
    relocated = compare(order(before), order(after))
    assert as_today.first_divergence.path.startswith("system[1]")  # the instructions, once the billing block is gone
    assert relocated.first_divergence.path.startswith("messages[1].content[0].text")  # after the initial context
    assert relocated.stable_prefix_bytes > as_today.stable_prefix_bytes


# --- initial context (Claude Code 2.1.332's environment message) --------------------------------------


def test_the_environment_message_goes_before_the_first_user_message_as_a_reminder():
    body = forwarded(claude_code.modern_request(3))
    assert canonical_value(body["messages"][0]) == {"role": "user", "content": REMINDER.format(claude_code.environment_text())}
    assert body["messages"][1]["content"][0]["text"] == claude_code.git_status_reminder()
    assert all(message["role"] != "system" for message in body["messages"])


def test_initial_context_moves_whether_sent_as_a_string_or_as_blocks():
    as_blocks = claude_code.modern_request(1)  # the newest message: a marked block list
    as_string = claude_code.modern_request(2)  # a later turn: the same message as a string
    assert isinstance(as_string["messages"][1]["content"], str) and isinstance(as_blocks["messages"][1]["content"], list)
    assert canonical_value(forwarded(as_blocks)["messages"][0]) == canonical_value(forwarded(as_string)["messages"][0])


def test_a_conversation_without_system_messages_is_left_alone():
    body = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    assert initial_context.lead_with_stable_context(body, "anthropic") == []


def test_several_initial_system_messages_keep_their_order():
    body = {"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "one"}, {"role": "system", "content": "two"}]}
    changes = initial_context.lead_with_stable_context(body, "anthropic")
    assert [message["content"] for message in body["messages"]] == [REMINDER.format("one"), REMINDER.format("two"), "hi"]
    assert [change.path for change in changes] == ["messages[1]", "messages[2]"]


def test_system_messages_after_the_first_assistant_message_stay_where_they_are():
    body = forwarded(claude_code.main_request(11))  # a reminder appended at the tail at turn 10
    tail = [i for i, m in enumerate(body["messages"]) if isinstance(m["content"], str) and "Reminder 10" in m["content"]]
    assert tail and tail[0] > 2 and body["messages"][tail[0]]["role"] == "user"


def test_initial_context_is_moved_and_rewritten_even_with_rewrite_system_messages_off():
    body = claude_code.main_request(11)
    body = forwarded(body, rules=Rules(rewrite_system_messages=False))
    assert body["messages"][0]["role"] == "user" and "src/app.py in the editor" in body["messages"][0]["content"]
    assert [m["role"] for m in body["messages"]].count("system") == 1  # the tail one, left for the server


def test_with_the_rule_off_the_environment_is_rewritten_in_place():
    body = forwarded(claude_code.modern_request(3), rules=Rules(lead_with_stable_context=False))
    assert body["messages"][0]["content"][0]["text"] == claude_code.git_status_reminder()
    assert body["messages"][1]["role"] == "user" and "# Environment" in canonical_value(body["messages"][1])["content"]


def test_openai_initial_context_goes_after_the_system_prompt_and_before_the_first_user_message():
    body = forwarded(claude_code.modern_openai_request(2), "openai")
    roles = [message["role"] for message in body["messages"]]
    assert roles[:3] == ["system", "user", "user"]
    assert body["messages"][1]["content"] == REMINDER.format(claude_code.environment_text())
    assert body["messages"][2]["content"][0]["text"] == claude_code.git_status_reminder()


def test_a_new_conversation_in_the_same_repository_shares_system_tools_and_environment():
    first = claude_code.modern_request(6)
    after_commit = claude_code.modern_request(1, git_status="M src/app.py", prompt="Now the docs.")
    moved = compare(order(first), order(after_commit))
    in_place = compare(order(first, rules=Rules(lead_with_stable_context=False)), order(after_commit, rules=Rules(lead_with_stable_context=False)))
    assert moved.first_divergence.path.startswith("messages[1].content[0].text")  # the git status, after the environment
    assert in_place.first_divergence.path.startswith("messages[0]")
    assert moved.stable_prefix_bytes - in_place.stable_prefix_bytes > len(claude_code.environment_text())


# --- empty system messages ----------------------------------------------------------------------------


@pytest.mark.parametrize("empty", ["", []])
def test_an_empty_system_message_is_rewritten_like_any_other(empty):
    body = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}, {"role": "system", "content": empty}]}
    system_messages.rewrite_system_messages(body, "anthropic")
    assert body["messages"][2]["role"] == "user"
    assert canonical_value(body["messages"][2])["content"] == REMINDER.format("")


def test_after_compact_no_system_message_is_left_for_the_server_to_hoist():
    body = forwarded(claude_code.compacted_request())
    assert all(message["role"] != "system" for message in body["messages"])
    assert canonical_value(body["messages"][0])["content"] == REMINDER.format("")


def test_a_system_message_of_unknown_shape_is_left_alone():
    odd = {"role": "system", "content": [{"type": "image", "source": {}}]}
    body = {"messages": [{"role": "user", "content": "hi"}, odd]}
    assert normalize.normalize(body, "anthropic") == [] and body["messages"][1] == odd


# --- determinism: every later turn repeats the earlier bytes -------------------------------------------


CONVERSATIONS = {
    "2.1.197": lambda turns: claude_code.main_request(turns, cch=f"{turns:05d}"),
    "2.1.332": lambda turns: claude_code.modern_request(turns, load_tools_at={3: ("WebFetch",), 7: ("NotebookEdit", "WebFetch")}),
    "2.1.332 subagent": lambda turns: claude_code.modern_subagent_request("general", turns),
}


@pytest.mark.parametrize("shape", sorted(CONVERSATIONS))
def test_each_turn_forwarded_is_a_prefix_of_the_next(shape):
    turns = [order(CONVERSATIONS[shape](turn)) for turn in range(1, 13)]
    for turn, (earlier, later) in enumerate(zip(turns, turns[1:]), start=1):
        comparison = compare(earlier, later)
        assert comparison.prefix_kept, f"turn {turn} -> {turn + 1}: broke at {comparison.first_divergence}"


def test_each_openai_turn_forwarded_is_a_prefix_of_the_next():
    turns = [order(claude_code.modern_openai_request(turn, load_tools_at={3: ("WebFetch",)}), "openai") for turn in range(1, 9)]
    for earlier, later in zip(turns, turns[1:]):
        assert compare(earlier, later).prefix_kept


@pytest.mark.parametrize("shape", sorted(CONVERSATIONS))
def test_normalizing_a_forwarded_body_again_changes_nothing(shape):
    assert normalize.normalize(forwarded(CONVERSATIONS[shape](8)), "anthropic") == []
