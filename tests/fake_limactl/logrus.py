"""Errors limactl reports, Go-style quoting and logrus-style log lines.

A `Fatal` becomes one `level=fatal` line on stderr and exit 1 (cmd/limactl/main.go); `ChildExit`
carries a `shell`/`copy` child's exit code, printed nothing (pkg/osutil/exit.go). Names in
messages are quoted like Go's %#q (backticks). stdout carries data only (`out`)."""

from __future__ import annotations

import datetime
import json
import re
import sys
from typing import Any


class Fatal(Exception):
    """An error that limactl reports with logrus.Fatal (exit 1)."""

    def __init__(self, msg: str, **fields: str) -> None:
        super().__init__(msg)
        self.msg = msg
        self.fields = fields


class NotExist(Exception):
    """Mirrors errors.Is(err, os.ErrNotExist) from store.Inspect."""


class LoadError(Exception):
    """lima.yaml could not be loaded or validated."""


class TemplateError(Exception):
    pass


class ChildExit(Exception):
    """The exit code of a child (shell/copy); printed nothing, like osutil.HandleExitError."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
               "\v": "\\v", '"': '\\"', "\\": "\\\\"}


def go_quote(s: str) -> str:
    """Go's %q (strconv.Quote)."""
    out = []
    for ch in s:
        o = ord(ch)
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif 0xDC80 <= o <= 0xDCFF:  # an undecodable byte smuggled in by surrogateescape
            out.append("\\x%02x" % (o - 0xDC00))
        elif 0xD800 <= o <= 0xDFFF:
            out.append("\\ufffd")
        elif ch.isprintable():
            out.append(ch)
        elif o < 0x80:
            out.append("\\x%02x" % o)
        elif o < 0x10000:
            out.append("\\u%04x" % o)
        else:
            out.append("\\U%08x" % o)
    return '"' + "".join(out) + '"'


def bq(s: str) -> str:
    """Go's %#q: backticks when possible (strconv.CanBackquote), else %q."""
    for ch in s:
        o = ord(ch)
        if ch == "`" or ch == "\ufeff" or 0xD800 <= o <= 0xDFFF or (o < 0x20 and ch != "\t") or o == 0x7F:
            return go_quote(s)
    return "`" + s + "`"


_LOGRUS_SAFE = re.compile(r"[A-Za-z0-9\-._/@^+]*")
LEVELS = {"panic": 0, "fatal": 1, "error": 2, "warning": 3, "info": 4, "debug": 5, "trace": 6}


def rfc3339_now() -> str:
    s = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    return s[:-6] + "Z" if s.endswith("+00:00") else s


def go_json(data: Any) -> str:
    """encoding/json's compact form: HTML characters and U+2028/2029 escaped."""
    line = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    for a, b in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                 ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        line = line.replace(a, b)
    return line


def json_line(level: str, msg: str, *, ts: str | None = None, **fields: Any) -> str:
    """One logrus JSONFormatter line (keys sorted, as Go marshals a map), without the newline."""
    data = {k: str(v) for k, v in fields.items()}
    data.update(level=level, msg=msg, time=ts or rfc3339_now())
    return go_json(dict(sorted(data.items())))


class Logger:
    """logrus TextFormatter (non-TTY) / JSONFormatter lines on stderr."""

    def __init__(self) -> None:
        self.level = LEVELS["info"]
        self.fmt = "text"

    def log(self, level: str, msg: str, *, ts: str | None = None, **fields: Any) -> None:
        if LEVELS[level] > self.level:
            return
        ts = ts or rfc3339_now()
        if self.fmt == "json":
            line = json_line(level, msg, ts=ts, **fields)
        else:
            parts = [f"time={self._value(ts)}", f"level={level}", f"msg={self._value(msg)}"]
            parts += [f"{k}={self._value(str(v))}" for k, v in sorted(fields.items())]
            line = " ".join(parts)
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    @staticmethod
    def _value(s: str) -> str:
        return s if _LOGRUS_SAFE.fullmatch(s) else go_quote(s)

    def info(self, msg: str, **fields: Any) -> None:
        self.log("info", msg, **fields)

    def warn(self, msg: str, **fields: Any) -> None:
        self.log("warning", msg, **fields)

    def error(self, msg: str, **fields: Any) -> None:
        self.log("error", msg, **fields)

    def debug(self, msg: str, **fields: Any) -> None:
        self.log("debug", msg, **fields)


def out(text: str) -> None:
    sys.stdout.write(text)
