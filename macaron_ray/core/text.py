"""Checks on generated text shared by the hops and the benchmarks."""

from __future__ import annotations

import re

_LOOP = re.compile(r"(\S.{3,79}?)(?:\s*\1){3,}", re.S)
_CODE_FENCE = re.compile(r"```.*?(```|$)", re.S)


def repetition_loop(text: str) -> bool:
    """A unit of 4..80 characters repeated at least four times in a row, outside code blocks: the
    greedy-decoding loop small models fall into ("(UI-AIM) (UI-AIM) (UI-AIM) ...")."""
    prose = " ".join(_CODE_FENCE.sub(" ", text).split())
    return _LOOP.search(prose) is not None
