"""JSON data as a type: what the commands' records (``--json``) and reports hold."""

from __future__ import annotations

from typing import TypeAlias

# a value json.dumps writes as it is (str keys; tuples come back as lists)
JSON: TypeAlias = "str | int | float | bool | list[JSON] | dict[str, JSON] | None"
