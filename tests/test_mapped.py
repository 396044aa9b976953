"""Mapped buffers kept for large frames: reused only when nothing views them, and bounded."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.kafka.frames import MAPPED_FROM, FrameReader
from proxy.runtime.mapped import MappedBuffers

MiB = 1024 * 1024


def test_a_mapping_is_handed_out_again_once_its_last_view_goes() -> None:
    buffers = MappedBuffers(retained_bytes=8 * MiB)
    first = buffers.take(3 * MiB)
    first[:5] = b"first"
    del first
    again = buffers.take(3 * MiB - 10)  # another size that fits it
    assert bytes(again[:5]) == b"first", "reused (its bytes were not zeroed)"
    assert buffers.kept_bytes == 3 * MiB


def test_a_mapping_a_slice_still_views_is_not_handed_out() -> None:
    buffers = MappedBuffers(retained_bytes=16 * MiB)
    view = buffers.take(2 * MiB)
    view[:5] = b"held!"
    part = view[1:3]  # what an answer keeps of a frame: a slice of it
    del view
    other = buffers.take(2 * MiB)
    assert bytes(other[:5]) == b"\0" * 5, "a fresh mapping: the first is still viewed"
    other[:5] = b"other"
    assert bytes(part) == b"el"
    del part, other
    third = buffers.take(2 * MiB)
    assert bytes(third[:5]) in (b"held!", b"other"), "once both views are gone, one of them is reused"


def test_the_mappings_kept_stay_within_their_bound() -> None:
    buffers = MappedBuffers(retained_bytes=8 * MiB)
    held = [buffers.take(4 * MiB - 100) for _ in range(3)]  # the third is not kept: 12 MiB > 8
    assert buffers.kept_bytes == 8 * MiB
    for view in held:
        view[-1] = 7
    del held
    small = buffers.take(MiB + 1)  # 2 MiB, and a 4 MiB one is more than twice that: one of them makes room
    small[:5] = b"small"
    assert buffers.kept_bytes == 6 * MiB and len(small) == MiB + 1
    big = buffers.take(5 * MiB)  # nothing kept fits: the other 4 MiB one makes room, the 2 MiB one is viewed
    assert buffers.kept_bytes == 7 * MiB and bytes(small[:5]) == b"small"
    del big


def test_mappings_idle_for_a_while_are_given_back_and_viewed_ones_kept() -> None:
    buffers = MappedBuffers(retained_bytes=16 * MiB)
    viewed = buffers.take(2 * MiB)
    idle = buffers.take(3 * MiB)
    del idle
    buffers.forget_idle(idle=60)
    assert buffers.kept_bytes == 5 * MiB, "not idle for long enough"
    buffers.forget_idle(idle=0)
    assert buffers.kept_bytes == 2 * MiB, "the unviewed one given back, the viewed one kept"
    del viewed
    buffers.forget_idle(idle=0)
    assert buffers.kept_bytes == 0


@settings(max_examples=30, deadline=None)
@given(frames=st.lists(st.tuples(st.integers(MAPPED_FROM, 3 * MAPPED_FROM), st.integers(0, 255), st.booleans()), min_size=1, max_size=8))
def test_frames_still_held_keep_their_bytes_while_later_frames_reuse_mappings(frames: list[tuple[int, int, bool]]) -> None:
    """Large frames received one after another through one set of kept mappings, some held on to (as an
    answer being written is): every frame held reads as it was sent, whatever came after it."""
    buffers = MappedBuffers(retained_bytes=6 * MiB)
    held: list[tuple[memoryview, int]] = []
    for size, fill, keep in frames:
        reader = FrameReader(max_frame_bytes=1 << 30, min_frame_bytes=1)
        reader.feed(struct.pack(">i", size))
        assert reader.next_frame() is None
        buffer = reader.receive_buffer(1, 1 << 30, buffers.take)
        assert buffer is not None and len(buffer) == size
        buffer[:] = bytes([fill]) * size
        reader.received(size)
        del buffer
        payload = reader.next_frame()
        assert isinstance(payload, memoryview) and len(payload) == size
        if keep:
            held.append((payload[size // 2 :], fill))  # a slice, as an answer holds one
        del payload
        assert buffers.kept_bytes <= 6 * MiB
        for view, expected in held:
            assert bytes(view) == bytes([expected]) * len(view)
