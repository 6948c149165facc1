"""A session record survives its encoding: refs packed as columns come back equal, in order."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvres.actors.config import SessionPolicy
from kvres.actors.host.journal import SessionRecord, decode_record, encode_record
from kvres.actors.host.store_ports import ColdRef
from kvres.coldstore import BlockKey
from kvres.policy import Range

names = st.sampled_from(["store-a", "store-b", "s1", "s2", "fp-0", "fp-1"])
refs = st.builds(
    lambda store, sid, fp, start, length, nbytes: ColdRef(store, BlockKey(sid, Range(start, start + length), fp), nbytes),
    names, names, names, st.integers(0, 2**40), st.integers(1, 4096), st.integers(0, 2**40))


@given(blocks=st.lists(refs, max_size=40), cold=st.lists(refs, max_size=40))
def test_refs_round_trip(blocks: list[ColdRef], cold: list[ColdRef]) -> None:
    record = SessionRecord(
        session_id="s1", token_log=[1, 2, 3], resident_ranges=[Range(0, 3)], blocks=blocks, cold=cold,
        policy=SessionPolicy(), last_logits=np.zeros(4, np.float32), counters={"evicted": 1}, fingerprint="fp-0")
    back = decode_record(encode_record(record))
    assert back.blocks == blocks and back.cold == cold
    assert back.token_log == record.token_log and back.resident_ranges == record.resident_ranges
