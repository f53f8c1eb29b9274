"""Digests: NeMo Gym's published vector, and the byte layout written out by hand."""

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from reassembler.formats import digests

# Copies of the vectors NeMo Gym publishes (the 0.7.0 one as shipped in its wheel, schema 2;
# the other the same call at schema 3): the repo carries them, nothing is read from outside.
GOLDEN = Path(__file__).parent / "data" / "golden"


@pytest.mark.parametrize("name", ["gym_staging_digest_v2_nemo_gym_0.7.0.json", "gym_staging_digest_v2.json"])
def test_golden_vector_reproduces_both_digests(name):
    g = json.loads((GOLDEN / name).read_text())
    assert digests.extras_digest(g["extras"]) == g["extras_digest"]
    c = g["staged_call"]
    ids_be, mask_be, lp_be = digests.to_be_bytes(
        np.array(c["token_ids_delta"]),
        np.array(c["token_mask_delta"], np.float32),
        np.array(c["generation_log_probs_delta"], np.float32),
    )
    got = digests.staged_call_digest(
        schema_version=c["schema_version"],
        digest_version=c["digest_version"],
        extras_digest_version=c["extras_digest_version"],
        rollout_id=c["rollout_id"],
        model_call_id=c["model_call_id"],
        parent_call_id=c["parent_call_id"],
        mode=c["mode"],
        prev_len=c["prev_len"],
        delta_len=c["delta_len"],
        cum_len=c["cum_len"],
        weight_version=c["weight_version"],
        ids_be=ids_be,
        mask_be=mask_be,
        logprobs_be=lp_be,
        extras_digest=c["extras_digest"],
        chain_hash=c["chain_hash"],
        cumulative_hash=c["cumulative_hash"],
    )
    assert got == g["staged_call_digest"]


def test_no_extras_digest_is_the_null_encoding():
    assert digests.NO_EXTRAS_DIGEST == hashlib.sha256(b"nemo-gym-staging-extras-v1\x01N").hexdigest()


def test_extras_encoding_by_hand():
    value = {"b": [True, None], "a": 1.5, "é": "x", "n": -2}
    expected = (
        b"nemo-gym-staging-extras-v1\x01"
        + b"D"
        + struct.pack(">Q", 4)
        + struct.pack(">Q", 1)
        + b"a"
        + b"F"
        + struct.pack(">d", 1.5)
        + struct.pack(">Q", 1)
        + b"b"
        + b"L"
        + struct.pack(">Q", 2)
        + b"B\x01"
        + b"N"
        + struct.pack(">Q", 1)
        + b"n"
        + b"I"
        + struct.pack(">q", -2)
        + struct.pack(">Q", 2)
        + "é".encode()
        + b"S"
        + struct.pack(">Q", 1)
        + b"x"
    )
    assert digests.extras_digest(value) == hashlib.sha256(expected).hexdigest()


def test_chain_and_cumulative_hash_by_hand():
    root_ids, child_ids = [1, 2, 3], [2**31 - 1]
    be = lambda v: b"".join(struct.pack(">Q", x) for x in v)  # noqa: E731
    root = hashlib.sha256(b"nemo-gym-staging-chain-v1\x00" + struct.pack(">Q", 3) + be(root_ids)).hexdigest()
    child = hashlib.sha256(
        b"nemo-gym-staging-chain-v1\x01" + bytes.fromhex(root) + struct.pack(">Q", 1) + be(child_ids)
    ).hexdigest()
    assert digests.chain_hash(None, be(root_ids)) == root
    assert digests.chain_hash(root, be(child_ids)) == child
    cumulative = hashlib.sha256(b"nemo-gym-staging-prefix-v2" + struct.pack(">Q", 4) + be(root_ids + child_ids))
    assert digests.cumulative_hash([be(root_ids), be(child_ids)]) == cumulative.hexdigest()
