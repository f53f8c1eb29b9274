"""Output items: which are generated, and the fingerprint of CONTRACT.md 2.1."""

import hashlib

from reassembler.items import fingerprint, generated_items, is_generated


def test_generated_items_are_reasoning_function_calls_and_assistant_messages():
    assert is_generated({"type": "reasoning"})
    assert is_generated({"type": "function_call"})
    assert is_generated({"type": "message", "role": "assistant"})
    assert is_generated({"type": "message"})
    assert not is_generated({"type": "message", "role": "user"})
    assert not is_generated({"type": "function_call_output"})


def test_fingerprint_ignores_id_and_status_and_sorts_keys_keeping_utf8():
    item = {"type": "message", "id": "msg_1", "status": "completed", "content": [{"text": "né", "a": 1}]}
    body = '{"content":[{"a":1,"text":"né"}],"type":"message"}'.encode()
    assert fingerprint(item) == hashlib.sha256(b"rr-output-item-v1" + body).hexdigest()
    assert fingerprint({**item, "id": "other", "status": "in_progress"}) == fingerprint(item)


def test_generated_items_keep_order_and_drop_empty_ids():
    out = generated_items(
        [{"type": "reasoning", "id": ""}, {"type": "function_call_output"}, {"type": "message", "id": "m"}]
    )
    assert [i for i, _ in out] == [None, "m"]
