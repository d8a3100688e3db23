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
    """Generation stops at the first token after which the text holds a stop sequence; the output is
    the text before the earliest stop found then (one that would only complete later never does)."""
    ts = TextStream(stops)
    chunks = _split(text.encode(), cuts)
    pieces = [ts.push(b) for b in chunks]
    pieces.append(ts.finish())
    want, hit, seen = text, False, b""
    for b in chunks:
        seen += b
        pre = seen.decode("utf-8", errors="ignore")  # the whole characters so far
        hits = [i for i in (pre.find(s) for s in stops) if i >= 0]
        if hits:
            want, hit = pre[: min(hits)], True
            break
    assert "".join(pieces) == want
    assert ts.stopped == hit
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
