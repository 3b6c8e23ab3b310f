import pytest

from taps_train.data.conversation import BadRecord, to_conversation


def test_roles_are_normalized_from_sharegpt_and_openai_forms():
    sharegpt = {"conversations": [{"from": "system", "value": "s"}, {"from": "Human", "value": "q"}, {"from": "chatgpt", "value": "a"}]}
    openai = {"id": "x", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    assert [m["role"] for m in to_conversation(sharegpt, "f:0").messages] == ["system", "user", "assistant"]
    conversation = to_conversation(openai, "f:1")
    assert conversation.id == "x" and conversation.messages[1] == {"role": "assistant", "content": "a"}


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ([1, 2], "record is not an object"),
        ({"text": "hi"}, "no 'conversations' or 'messages' list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "unknown role"),
        ({"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "a"}]}, "empty or non-string turn"),
        ({"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "a"}]}, "empty or non-string turn"),
        ({"messages": [{"role": "user", "content": "q"}]}, "no assistant turn"),
    ],
)
def test_malformed_records_are_rejected_with_a_reason(record, reason):
    with pytest.raises(BadRecord, match=reason):
        to_conversation(record, "f:0")
