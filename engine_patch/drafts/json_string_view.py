"""The prompt as a JSON string would quote it: where tool calls copy code from.

An agent's Edit and Write are tool calls, and a tool call's arguments are JSON:
the `old_string` an Edit repeats, the `content` a Write repeats, are the lines
it read with every newline written `\\n`, every quote `\\"`, every backslash
doubled. Token for token that is another sequence than the code in the prompt,
so the longest earlier agreement breaks at every line end. The proposer gets
the prompt's text once more, escaped as a JSON string body and tokenized the
way the model tokenizes what it writes, as one more source to copy from.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def json_string_view(tokenizer: Any, prompt: Sequence[int]) -> list[int]:
    """The tokens of the prompt's text escaped as the inside of a JSON string."""
    text = tokenizer.decode(list(prompt))
    return list(tokenizer.encode(json.dumps(text)[1:-1], add_special_tokens=False))
