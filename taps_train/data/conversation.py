"""Conversations in one normalized form: a list of `{"role", "content"}` messages.

Sources come in ShareGPT form (`conversations` with `from`/`value`) or OpenAI form (`messages` with
`role`/`content`) and use many role spellings; everything downstream sees only system / user /
assistant, which is what chat templates expect.
"""

from dataclasses import dataclass

from taps_train.data.records import contains_invalid_utf8

ROLE_ALIASES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
}


class BadRecord(ValueError):
    """A record that cannot become a conversation; its message is the reason it is counted under."""


@dataclass(frozen=True)
class Conversation:
    id: str
    messages: list[dict[str, str]]


def to_conversation(record: object, fallback_id: str) -> Conversation:
    """Normalize one ShareGPT- or OpenAI-style record, or raise `BadRecord` with the reason."""
    if not isinstance(record, dict):
        raise BadRecord("record is not an object")
    if isinstance(record.get("conversations"), list):
        turns, role_key, text_key = record["conversations"], "from", "value"
    elif isinstance(record.get("messages"), list):
        turns, role_key, text_key = record["messages"], "role", "content"
    else:
        raise BadRecord("no 'conversations' or 'messages' list")
    messages = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise BadRecord("turn is not an object")
        role = ROLE_ALIASES.get(str(turn.get(role_key, "")).strip().lower())
        if role is None:
            raise BadRecord("unknown role")
        text = turn.get(text_key)
        if not isinstance(text, str) or not text.strip():
            raise BadRecord("empty or non-string turn")
        if contains_invalid_utf8(text):
            raise BadRecord("invalid UTF-8 text")
        messages.append({"role": role, "content": text})
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRecord("no assistant turn")
    if not any(m["role"] == "user" for m in messages):
        raise BadRecord("no user turn")
    return Conversation(id=str(record.get("id", fallback_id)), messages=messages)
