"""gh's hosts.yml read without PyYAML (agentbox.credentials.broker.ghhosts): side by side with PyYAML on gh's own
shapes and on hostile ones, the small reader gives what PyYAML gives or declines (and the broker then asks PyYAML).
The launch itself (no PyYAML imported with a gh login present) is in tests/test_own_time.py."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import yaml

from agentbox.credentials.broker import ghhosts

pytestmark = pytest.mark.timeout(60)

GH = ("github.com:\n    users:\n        octo:\n            oauth_token: gho_abc123\n    git_protocol: https\n"
      "    user: octo\n    oauth_token: gho_abc123\n")

# (what it is, the file, whether the small reader takes it)
CASES: list[tuple[str, str, bool]] = [
    ("gh's own, users: and the token", GH, True),
    ("gh before users:", "github.com:\n    oauth_token: gho_x\n    user: octo\n    git_protocol: ssh\n", True),
    ("the keyring: no token, an empty user", "github.com:\n    users:\n        octo:\n    git_protocol: https\n"
                                            "    user: octo\n", True),
    ("an empty mapping as {}", "github.com:\n    users:\n        octo: {}\n    user: octo\n", True),
    ("two hosts", GH + "ghe.example.com:\n    oauth_token: ghp_other\n    user: me\n", True),
    ("comments and blank lines", "# gh\n\ngithub.com: # the host\n\n    # a note\n    user: octo   # me\n"
                                 "    oauth_token: gho_x\n\n", True),
    ("two-space indent", "github.com:\n  user: octo\n  users:\n    octo:\n      oauth_token: gho_x\n", True),
    ("quoted scalars", "github.com:\n    user: 'oc''to'\n    oauth_token: \"gho_x\"\n    git_protocol: 'a #b'\n",
     True),
    ("empty quoted", "github.com:\n    oauth_token: ''\n    user: \"\"\n", True),
    ("no final newline", "github.com:\n    user: octo", True),
    ("only comments", "# nothing\n\n", True),
    ("empty", "", True),
    ("a host without entries", "github.com:\n", True),
    ("dedent to the top", "github.com:\n    users:\n        octo:\n            oauth_token: a\nother.com:\n    user: b\n",
     True),
    # Words YAML reads as something else than a string: declined, PyYAML says what they are.
    ("a boolean word", "github.com:\n    user: yes\n", False),
    ("null", "github.com:\n    user: null\n", False),
    ("a tilde", "github.com:\n    user: ~\n", False),
    ("a number", "github.com:\n    user: 12345\n", False),
    ("a float", "github.com:\n    user: 1.5\n", False),
    ("hex", "github.com:\n    user: 0x1f\n", False),
    ("a date", "github.com:\n    user: 2001-12-14\n", False),
    ("a boolean key", "on:\n    user: octo\n", False),
    ("a numeric key", "github.com:\n    users:\n        1234:\n            oauth_token: a\n", False),
    ("an infinity", "github.com:\n    user: .inf\n", False),
    # Hostile or unusual: declined.
    ("an anchor and an alias", "github.com: &h\n    user: octo\nother.com: *h\n", False),
    ("a merge key", "a: &h\n    user: octo\nb:\n    <<: *h\n", False),
    ("flow style", "github.com: {user: octo, oauth_token: gho_x}\n", False),
    ("flow sequence", "github.com:\n    users: [octo]\n", False),
    ("a block sequence", "github.com:\n    - octo\n", False),
    ("tabs", "github.com:\n\tuser: octo\n", False),
    ("a tab after the colon", "github.com:\n    user:\tocto\n", False),
    ("duplicate keys", "github.com:\n    user: a\n    user: b\n", False),
    ("duplicate hosts", "github.com:\n    user: a\ngithub.com:\n    user: b\n", False),
    ("two documents", "github.com:\n    user: a\n---\ngithub.com:\n    user: b\n", False),
    ("a document start", "---\ngithub.com:\n    user: a\n", False),
    ("a document end", "github.com:\n    user: a\n...\n", False),
    ("a directive", "%YAML 1.1\n---\ngithub.com:\n    user: a\n", False),
    ("a tag", "github.com:\n    user: !!str octo\n", False),
    ("a python tag", "github.com: !!python/object:os.system\n    user: a\n", False),
    ("a block scalar", "github.com:\n    user: |\n        octo\n", False),
    ("a folded scalar", "github.com:\n    user: >\n        octo\n", False),
    ("a multi-line plain scalar", "github.com:\n    user: octo\n        more\n", False),
    ("a multi-line quoted scalar", "github.com:\n    user: 'octo\n        more'\n", False),
    ("an unclosed quote", "github.com:\n    user: 'octo\n", False),
    ("an escape in double quotes", "github.com:\n    user: \"oc\\tto\"\n", False),
    ("a quote after a quote", "github.com:\n    user: 'a' 'b'\n", False),
    ("a comment without a space", "github.com:\n    user: octo#x\n", False),
    ("a quoted comment without a space", "github.com:\n    user: 'octo'#x\n", False),
    ("a quoted key", "\"github.com\":\n    user: octo\n", False),
    ("a complex key", "? github.com\n: user\n", False),
    ("no space after the colon", "github.com:\n    user:octo\n", False),
    ("a space before the colon", "github.com :\n    user: octo\n", False),
    ("a colon in the value", "github.com:\n    user: a:b\n", False),
    ("an indented top level", "  github.com:\n    user: octo\n", False),
    ("uneven indentation", "github.com:\n    users:\n        octo:\n            oauth_token: a\n      user: b\n", False),
    ("a deeper line after a value", "github.com: x\n    user: octo\n", False),
    ("a sibling deeper than the first", "github.com:\n    user: a\n      git_protocol: b\n", False),
    ("CRLF", "github.com:\r\n    user: octo\r\n", False),
    ("a BOM", "\ufeffgithub.com:\n    user: octo\n", False),
    ("non-ASCII", "github.com:\n    user: \u00e9t\u00e9\n", False),
    ("a NUL", "github.com:\n    user: oc\x00to\n", False),
    ("a top-level scalar", "octo\n", False),
    ("a top-level list", "- octo\n", False),
    ("deep nesting", "".join(f"{'  ' * depth}k{depth}:\n" for depth in range(40)), False),
    ("a long key", f"github.com:\n    users:\n        {'x' * 2000}:\n            oauth_token: a\n", False),
    ("a huge file", GH + "".join(f"host{n}.example.com:\n    user: u{n}\n" for n in range(4000)), False),
]


def pyyaml(text: bytes) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return f"error: {exc}"


@pytest.mark.parametrize(("what", "text", "taken"), CASES, ids=[case[0] for case in CASES])
def test_the_small_reader_gives_what_pyyaml_gives_or_declines(what: str, text: str, taken: bool) -> None:
    data = text.encode()
    small = ghhosts.load(data)
    assert (small is not None) is taken, what
    if small is not None:
        # the same values and the same order of keys
        assert json.dumps(small[0]) == json.dumps(pyyaml(data)), what


def test_mutations_of_ghs_file_are_read_as_pyyaml_reads_them_or_declined() -> None:
    """Thousands of variants of gh's file, each a few characters inserted, deleted or replaced: whatever the
    small reader takes, PyYAML reads the same (and some of them are taken, or the check would be empty)."""
    pieces = [" ", "  ", "\n", ":", "#", "'", '"', "-", "{}", "&a", "*a", "\t", "yes", "1", "_", ".", "~", "!", "x"]
    chance = random.Random(40)
    taken = 0
    for _ in range(3000):
        text = GH
        for _ in range(chance.randint(1, 3)):
            at = chance.randrange(len(text) + 1)
            cut = chance.choice([0, 0, 1, 2])
            text = text[:at] + chance.choice(pieces + [""]) + text[at + cut:]
        small = ghhosts.load(text.encode())
        if small is not None:
            taken += 1
            assert json.dumps(small[0]) == json.dumps(pyyaml(text.encode())), repr(text)
    assert taken > 300


VALUES = ["octo", "gho_abc123", "https", "ssh", "a.b-c_d", "yes", "No", "null", "on", "~", "", "12", "1.5", "0x1f",
          "2001-12-14", "-x", "a b", "a: b", "a#b", "'q'", "\u00e9", ".inf", "_", "x" * 100, "x" * 200, "x" * 2000]


@pytest.mark.parametrize("value", VALUES)
def test_the_vms_hosts_yml_is_pyyamls_text_or_pyyamls_own(value: str) -> None:
    """The writer's text for the VM is PyYAML's safe_dump, byte for byte, or it declines (None)."""
    for document in ({"github.com": {"git_protocol": value, "oauth_token": "gho_agentbox-ph-" + "0" * 24}},
                     {"github.com": {"user": value, "users": {value: {"oauth_token": "p"}}}}):
        text = ghhosts.dump(document)
        if text is not None:
            assert text == yaml.safe_dump(document, default_flow_style=False, sort_keys=True), value
    assert (ghhosts.dump({"github.com": {"user": value}}) is None) is not ghhosts.plain(value)
    assert (ghhosts.dump({"github.com": {value: "x"}}) is None) is not (ghhosts.plain(value) and len(value) <= 100)
    assert ghhosts.dump({"github.com": {"users": {}}}) is None  # PyYAML writes {} for it
    assert ghhosts.dump({"github.com": {"port": 22}}) is None
