"""Output items: which are generated, and the fingerprint of CONTRACT.md 2.1."""

import hashlib
import json

from hypothesis import given, settings
from hypothesis import strategies as st

import reassembler.load.json_lines as json_lines
from reassembler.formats.gym_fingerprint import model_items
from reassembler.formats.items import canonical_json, fingerprint, generated_items, is_generated


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


# -- the reader's fast path: orjson where it writes the same bytes as json


_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0.1, 1e16, -0.0, 1e-7, 2.5])
    | _text
)
_values = st.recursive(
    _scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(_text, c, max_size=3), max_leaves=12
)
_items = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["message", "reasoning", "function_call", "function_call_output"])},
        optional={"role": st.sampled_from(["assistant", "user"]), "content": _values, "arguments": _values},
    ),
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(_items)
def test_fingerprints_of_lines_read_with_or_without_marked_floats_equal_the_reference(output):
    line = json.dumps({"output": output})  # what a rollout line holds
    plain = json.loads(line)["output"]
    marked = json_lines.ROLLOUT_DECODER.decode(line)["output"]
    reference = [(item.get("id") or None, _reference(item)) for item in plain if is_generated(item)]
    assert generated_items(marked, floats_marked=True) == reference
    assert generated_items(plain) == reference  # orjson for the items without a float
    assert model_items(marked) == model_items(plain)


def _reference(item: dict) -> str:
    """CONTRACT.md 2.1's fingerprint, written by `json` alone."""
    hidden = ("id", "status", "prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts")
    body = {k: v for k, v in item.items() if k not in hidden}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(b"rr-output-item-v1" + text.encode("utf-8")).hexdigest()


def test_a_float_or_a_big_integer_goes_to_json():
    marked = json_lines.ROLLOUT_DECODER.decode('{"a": 1e16, "b": [0.1, NaN], "c": 18446744073709551616}')
    assert canonical_json(marked, floats_marked=True) == b'{"a":1e+16,"b":[0.1,NaN],"c":18446744073709551616}'
    assert canonical_json({"é": [1, "x"]}, floats_marked=True) == '{"é":[1,"x"]}'.encode()
    unmarked = {"a": [{"b": float("nan")}], "c": 1}  # a plain float, nested: json (orjson would write null)
    assert canonical_json(unmarked) == b'{"a":[{"b":NaN}],"c":1}'
    assert canonical_json({"c": 2**64}) == b'{"c":18446744073709551616}'
