"""TextStream: whole UTF-8 characters only, and stop sequences found across token boundaries and
never emitted, even in part."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from webtensor.serve.textstream import TextStream

ALPHABET = st.sampled_from(list("ab \nXé😀—"))


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[i:j] for i, j in zip(points, points[1:], strict=False)]


@settings(max_examples=300, deadline=None)
@given(st.text(ALPHABET, max_size=40), st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=3),
       st.lists(st.integers(0, 200), max_size=20))
def test_output_is_text_before_first_stop(text, stops, cuts):
    ts = TextStream(stops)
    pieces = [ts.push(b) for b in _split(text.encode(), cuts)]
    pieces.append(ts.finish())
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    want = text[: min(hits)] if hits else text
    assert "".join(pieces) == want
    assert ts.stopped == bool(hits)
    emitted = ""
    for p in pieces:  # no prefix of the output ever holds a stop sequence
        emitted += p
        assert not any(s in emitted for s in stops)


def test_split_character_waits_for_its_last_byte():
    ts = TextStream()
    b = "😀".encode()
    assert [ts.push(b[:1]), ts.push(b[1:3]), ts.push(b[3:])] == ["", "", "😀"]


def test_stop_across_tokens_is_held_then_dropped():
    ts = TextStream(["\nUser:"])
    assert ts.push(b"Hi there") == "Hi there"
    assert ts.push(b"\nUs") == ""  # may be the start of the stop sequence: held
    assert ts.push(b"er: more") == ""
    assert ts.stopped


def test_held_text_released_when_not_a_stop():
    ts = TextStream(["STOP"])
    assert ts.push(b"ST") == ""
    assert ts.push(b"ep") == "STep"
    assert ts.push(b" ST") == " "
    assert ts.finish() == "ST"
