"""An incremental Server-Sent Events parser with no line-length limit.

Follows the WHATWG event-stream rules that matter for LLM servers: lines end with ``\\n``,
``\\r\\n`` or ``\\r`` (also when split across network reads), a blank line dispatches the
event, ``data:`` lines are joined with ``\\n``, one space after the colon is dropped, lines
starting with ``:`` are comments (keep-alive pings), ``event:`` names the event type.

It buffers bytes, not lines of a bounded reader: aiohttp's ``StreamReader.readline`` limit
(64 KiB, then 128 KiB) made ``vllm bench serve`` and TensorRT-LLM's client fail on long
chunks ("Chunk too big"); here a single event may be any size.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: bytes
    event: str = "message"
    # the text after ``clock_prefix`` of the last such comment line seen (see SSEParser)
    clock: bytes | None = None


class SSEParser:
    """Feed bytes as they arrive; get back the events completed by them.

    ``clock_prefix``: comment lines starting with ``:`` + optional space + this prefix are kept
    (the rest of the line, stripped) and every event from then on carries the last one as
    ``clock`` — perflab's simulator stamps its steps this way
    (:data:`perflab.bench.serverclock.SERVER_CLOCK_COMMENT`); other comments stay ignored.
    """

    __slots__ = ("_buf", "_clock", "_clock_prefix", "_data", "_event", "_has_data", "_skip_lf")

    def __init__(self, clock_prefix: bytes | None = None) -> None:
        self._clock_prefix = clock_prefix
        self._clock: bytes | None = None
        self._buf = b""
        self._data: list[bytes] = []
        self._event = ""
        self._has_data = False
        self._skip_lf = False  # the previous chunk ended with "\r": a leading "\n" pairs with it

    @property
    def idle(self) -> bool:
        """Between events: nothing buffered, no field of an event read yet."""
        return not self._buf and not self._has_data and not self._event and not self._skip_lf

    @property
    def clock(self) -> bytes | None:
        """The clock the next event will carry (see ``clock_prefix``)."""
        return self._clock

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        return [SSEEvent(data, event, clock) for data, event, clock in self.feed_data(chunk)]

    def feed_data(self, chunk: bytes) -> list[tuple[bytes, str, bytes | None]]:
        """:meth:`feed` without the event objects: ``(data, event, clock)`` per event."""
        if not self._buf and not self._has_data and not self._event and not self._skip_lf and chunk[:6] == b"data: " and chunk[-2:] == b"\n\n":
            # The common read: whole one-line "data:" events and nothing else. Split on the
            # blank lines; any other field, comment, CR or multi-line event takes the full path.
            frames = chunk[:-2].split(b"\n\n")
            if b"\r" not in chunk and all(f[:6] == b"data: " and b"\n" not in f for f in frames):
                clock = self._clock
                return [(f[6:], "message", clock) for f in frames]
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        if not chunk:
            return []
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            self._skip_lf = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = lines.pop()  # the unterminated rest (often b"")
        events: list[tuple[bytes, str, bytes | None]] = []
        for line in lines:
            if not line:
                if self._has_data:
                    events.append((b"\n".join(self._data), self._event or "message", self._clock))
                self._data = []
                self._event = ""
                self._has_data = False
                continue
            if line[:1] == b":":
                prefix = self._clock_prefix
                if prefix is not None:
                    text = line[1:].lstrip(b" ")
                    if text.startswith(prefix):
                        self._clock = text[len(prefix):].strip()
                continue
            name, sep, value = line.partition(b":")
            if sep and value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                self._data.append(value)
                self._has_data = True
            elif name == b"event":
                self._event = value.decode("utf-8", "replace")
            # "id" and "retry" do not matter to a benchmark; unknown fields are ignored.
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: an event left without its blank line still counts.

        The standard drops it, but servers that close right after the last ``data:`` line
        exist, and vLLM's client accepts them too.
        """
        return [SSEEvent(data, event, clock) for data, event, clock in self.close_data()]

    def close_data(self) -> list[tuple[bytes, str, bytes | None]]:
        """:meth:`close` without the event objects."""
        self._skip_lf = False
        if self._buf:
            return self.feed_data(b"\n\n")
        if self._has_data:
            return self.feed_data(b"\n")
        return []
