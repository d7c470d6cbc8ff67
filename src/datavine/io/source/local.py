"""A local path: the file is on the worker (or the client) and is opened where it is.

Its reads are near by definition: the run summary counts them as ``"local"`` bytes. Errors
are the opener's own (``FileNotFoundError`` naming the path), not wrapped.
"""

from __future__ import annotations

from datavine.io.source.base import LOCAL, H, Opener, OpenRecord, Source, open_on


class LocalSource(Source):
    """Opens a local path as given."""

    def open(self, url: str, opener: Opener[H], **options: object) -> tuple[H, OpenRecord]:
        return open_on(LOCAL, url, opener, **options)
