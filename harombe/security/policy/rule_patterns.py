"""Bounds on the regular expressions of HITL rules: the pattern is the operator's, the text it
is searched in is whatever a caller sends, so a pattern that can backtrack exponentially is
refused when the rule is made, and very long values are not searched at all."""

from __future__ import annotations

from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

#: Values longer than this are not searched by a rule's ``matches``: such a condition is counted
#: as holding when that only raises the risk, and as failing for a rule that needs no approval.
MAX_MATCH_CHARS = 1_000_000

_REPEATS = {"MAX_REPEAT", "MIN_REPEAT"}


def backtracks_exponentially(pattern: str) -> bool:
    """Whether ``pattern`` has a repetition (``*``, ``+``, ``{n,}``) of a group that itself
    holds an unbounded repetition or alternatives: the shapes whose backtracking is exponential
    (``(a+)+$``, ``(\\w*\\s?)*$``, ``(a|aa)+$``). Possessive and atomic forms are safe."""

    def walk(items: Any, inside_repeat: bool) -> bool:
        for op, arg in items:
            name = str(op)
            if name in _REPEATS:
                low, high, sub = arg
                unbounded = high == sre_parse.MAXREPEAT or high > 100
                if inside_repeat and high != low:  # (a+)+, (a{1,3})+: many ways to split
                    return True
                if walk(sub, inside_repeat or unbounded):
                    return True
            elif name == "BRANCH":
                if inside_repeat and _alternatives_overlap(arg[1]):
                    return True
                if any(walk(branch, inside_repeat) for branch in arg[1]):
                    return True
            elif name == "SUBPATTERN":
                if walk(arg[-1], inside_repeat):
                    return True
            elif name in ("ASSERT", "ASSERT_NOT") and walk(arg[1], inside_repeat):
                return True
            # POSSESSIVE_REPEAT and ATOMIC_GROUP never backtrack into themselves.
        return False

    return walk(sre_parse.parse(pattern), False)


def _alternatives_overlap(branches: list[Any]) -> bool:
    """Whether two alternatives may start with the same character (``a|ab``); alternatives
    that each start with a different literal (``foo|bar``) cannot both match at one place."""
    firsts: set[int] = set()
    for branch in branches:
        items = list(branch)
        if not items or str(items[0][0]) != "LITERAL" or items[0][1] in firsts:
            return True
        firsts.add(items[0][1])
    return False
