"""What a client must never receive: private names (adapter ids, the base model's path) and the
marks of a stack trace or a source path. The load test and `macaron chaos` scan every header,
body and streamed byte they receive with a `LeakScan`."""

from __future__ import annotations

import codecs

LEAK_MARKERS = ("Traceback", 'File "', "site-packages", "macaron_ray")


def local_private_names() -> tuple[str, ...]:
    """The private names of this checkout's embedded deployment: the committed adapters' ids and
    the base model's directory (what a load test on this machine may look for)."""
    from macaron_ray.adapters.manifest import Manifest
    from macaron_ray.model.prepare import base_model_dir

    return (*(a.adapter_id for a in Manifest.load().adapters), str(base_model_dir()))


class LeakScan:
    """Finds `private` strings and `LEAK_MARKERS` in text received piece by piece: a string split
    between two pieces of one stream is still found (each stream keeps a tail of its own)."""

    def __init__(self, private: tuple[str, ...] = ()):
        self.needles = tuple(n for n in (*private, *LEAK_MARKERS) if n)
        self.keep = max(map(len, self.needles), default=1) - 1
        self.found: set[str] = set()

    def scan(self, text: str) -> None:
        self.found.update(n for n in self.needles if n in text)

    def stream(self) -> "StreamScan":
        return StreamScan(self)


class StreamScan:
    def __init__(self, scan: LeakScan):
        self.scan, self.tail = scan, ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed_bytes(self, chunk: bytes) -> None:
        """A chunk of a byte stream (a character split between chunks is decoded whole)."""
        self.feed(self._decoder.decode(chunk))

    def feed(self, text: str) -> None:
        window = self.tail + text
        self.scan.scan(window)
        self.tail = window[-self.scan.keep:] if self.scan.keep else ""
