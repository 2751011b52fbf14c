"""The Codex config transform (agentbox/sync/transform.py) writes TOML that reads back as the data it meant.

Codex reads config.toml with a TOML 1.0 parser; so do tomllib and tomli. tomli-w writes it: strings with any
character, numbers (inf and nan), dates and times, arrays, tables and arrays of tables, and keys that need
quoting, in the shapes a parsed config.toml can have.
"""

from __future__ import annotations

import datetime
import math
import sys

import pytest

from agentbox.agents.codex import SETTINGS as CODEX_SETTINGS
from agentbox.sync.filter import runs_programs
from agentbox.sync.transform import Context, Note, Unusable, codex_config

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

# Quick tests (no VM): a minute each at most, not the suite's 300 s.
pytestmark = pytest.mark.timeout(60)

CONTEXT = Context(agent="codex", host_home="/home/ada", guest_home="/home/ada.linux", mounts=(), synced=(),
                  mcp_secrets=False)

# Each sample is a config.toml's content (written in TOML below by hand, so the writer under test is not
# also the one making its input) and the data it holds.
SAMPLES = [
    ("", {}),
    ('model = "gpt-5"\napproval_policy = "on-request"\n', {"model": "gpt-5", "approval_policy": "on-request"}),
    ('text = "quote \\" backslash \\\\ tab \\t newline \\n bell \\u0007 del \\u007f é 😀"\nempty = ""\n',
     {"text": 'quote " backslash \\ tab \t newline \n bell \x07 del \x7f é 😀', "empty": ""}),
    ("int = -3\nbig = 4611686018427387904\nfloat = 1.5\ntiny = 1e-300\ninf = inf\nninf = -inf\nflag = false\n",
     {"int": -3, "big": 2**62, "float": 1.5, "tiny": 1e-300, "inf": math.inf, "ninf": -math.inf, "flag": False}),
    ("when = 2024-05-01T12:30:05.12Z\nlocal = 2024-05-01T12:30:00\nday = 2024-05-01\ntime = 07:45:01\n",
     {"when": datetime.datetime(2024, 5, 1, 12, 30, 5, 120000, tzinfo=datetime.timezone.utc),
      "local": datetime.datetime(2024, 5, 1, 12, 30), "day": datetime.date(2024, 5, 1),
      "time": datetime.time(7, 45, 1)}),
    ('list = [1, 2, 3]\nnested = [[1, "a"], [], [{k = "v"}]]\nmixed = [{a = 1}, 2]\nno = []\n',
     {"list": [1, 2, 3], "nested": [[1, "a"], [], [{"k": "v"}]], "mixed": [{"a": 1}, 2], "no": []}),
    ('"weird key" = 1\n"dotted.key" = 2\n"" = 3\n"ünïcode" = 4\n"key\\nnewline" = 5\n',
     {"weird key": 1, "dotted.key": 2, "": 3, "ünïcode": 4, "key\nnewline": 5}),
    ('top = true\n[mcp_servers.fetch]\ncommand = "npx"\nargs = ["-y", "x"]\nenv = { PATH_HINT = "" }\n'
     '[mcp_servers.remote]\nurl = "https://example.com"\n',
     {"mcp_servers": {"fetch": {"command": "npx", "args": ["-y", "x"], "env": {"PATH_HINT": ""}},
                      "remote": {"url": "https://example.com"}}, "top": True}),
    ('[projects."/Users/ada/work/app"]\ntrust_level = "trusted"\n',
     {"projects": {"/Users/ada/work/app": {"trust_level": "trusted"}}}),
    ("[empty_table]\n[only_tables.a.b]\nc = 1\n", {"empty_table": {}, "only_tables": {"a": {"b": {"c": 1}}}}),
    ('[[servers]]\nname = "a"\n[servers.env]\nX = "1"\n[[servers.more]]\ndeep = true\n[[servers]]\nname = "b"\n',
     {"servers": [{"name": "a", "env": {"X": "1"}, "more": [{"deep": True}]}, {"name": "b"}]}),
]


@pytest.mark.parametrize(("text", "data"), SAMPLES, ids=range(len(SAMPLES)))
def test_what_it_writes_reads_back_as_the_same_data(text: str, data: dict) -> None:
    notes: list[Note] = []
    # notify is dropped, so the file is always rewritten (an unchanged file would be passed through as it is).
    written = codex_config(b'notify = ["notify-send"]\n' + text.encode(), CONTEXT, notes)
    assert tomllib.loads(written.decode()) == {**data, **CODEX_SETTINGS}
    assert codex_config(written, CONTEXT, []) == written  # nothing left to change: the same bytes
    assert Note("notify", "dropped", "it runs a program after each turn") in notes


def test_an_unchanged_file_is_passed_through_with_its_comments() -> None:
    text = b'# mine\nmodel = "gpt-5"  # the default\napproval_policy = "never"\nsandbox_mode = "danger-full-access"\n'
    assert codex_config(text, CONTEXT, []) == text


@pytest.mark.parametrize(("data", "why"), [
    (b"model = \xff\n", "it is not UTF-8 text"),
    (b'model = "a"\nmodel = "b"\n', "it is not valid TOML (Cannot overwrite a value (at line 2, column 12))"),
])
def test_a_file_that_does_not_parse_is_refused_with_the_reason(data: bytes, why: str) -> None:
    with pytest.raises(Unusable) as caught:
        codex_config(data, CONTEXT, [])
    assert str(caught.value) == why


@pytest.mark.parametrize(("text", "why"), [
    ('prompt = "Plan it"\nnote = "no hooks here, no mcp"\n', None),
    ('[profiles.fast.mcp_servers.x]\ncommand = "run-me"\n',
     "it defines `mcp_servers`, which would run programs on your host"),
    ('prompt = "a"\nprompt = "b"\n', "not valid TOML (Cannot overwrite a value (at line 2, column 13))"),
])
def test_a_pulled_toml_file_is_read_with_a_real_parser(text: str, why: str | None) -> None:
    # The same reader (tomllib, or tomli on 3.10) decides whether `sync pull` may bring a TOML file back.
    assert runs_programs("commands/plan.toml", text.encode()) == why
