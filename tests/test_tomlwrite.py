"""The small TOML writer (agentbox/sync/tomlwrite.py) writes what tomllib reads back as the same data."""

from __future__ import annotations

import datetime
import math
import sys

import pytest

from agentbox.sync import tomlwrite

# Quick tests (no VM): a minute each at most, not the suite's 300 s.
pytestmark = pytest.mark.timeout(60)

tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else None

SAMPLES = [
    {},
    {"model": "gpt-5", "approval_policy": "never"},
    {"text": 'quote " backslash \\ tab \t newline \n bell \x07 del \x7f é 😀', "empty": ""},
    {"int": -3, "big": 2**62, "float": 1.5, "tiny": 1e-300, "inf": math.inf, "ninf": -math.inf, "flag": False},
    {"when": datetime.datetime(2024, 5, 1, 12, 30, 5, 120000, tzinfo=datetime.timezone.utc),
     "local": datetime.datetime(2024, 5, 1, 12, 30), "day": datetime.date(2024, 5, 1),
     "time": datetime.time(7, 45, 1)},
    {"list": [1, 2, 3], "nested": [[1, "a"], [], [{"k": "v"}]], "mixed": [{"a": 1}, 2], "no": []},
    {"weird key": 1, "dotted.key": 2, "": 3, "ünïcode": 4, "key\nnewline": 5},
    {"mcp_servers": {"fetch": {"command": "npx", "args": ["-y", "x"], "env": {"TOKEN": ""}},
                     "remote": {"url": "https://example.com"}}, "top": True},
    {"projects": {"/Users/ada/work/app": {"trust_level": "trusted"}}},
    {"empty_table": {}, "only_tables": {"a": {"b": {"c": 1}}}},
    {"servers": [{"name": "a", "env": {"X": "1"}, "more": [{"deep": True}]}, {"name": "b"}]},
]


@pytest.mark.skipif(tomllib is None, reason="tomllib is Python 3.11+")
@pytest.mark.parametrize("data", SAMPLES, ids=range(len(SAMPLES)))
def test_what_it_writes_reads_back_as_the_same_data(data: dict) -> None:
    assert tomllib is not None
    text = tomlwrite.dumps(data)
    assert tomllib.loads(text) == data
    assert tomlwrite.dumps(tomllib.loads(text)) == text


def test_it_refuses_what_toml_cannot_hold() -> None:
    with pytest.raises(TypeError, match="TOML has no value of type NoneType"):
        tomlwrite.dumps({"x": None})
    with pytest.raises(TypeError, match="TOML keys are strings"):
        tomlwrite.dumps({1: "x"})  # type: ignore[dict-item]
