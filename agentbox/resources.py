"""The one place that locates files shipped with agentbox (templates, provision scripts, wrappers)."""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_dir() -> Path:
    """agentbox/_data in an installed wheel; the repository root in an editable install or checkout."""
    installed = _PACKAGE_DIR / "_data"
    if installed.is_dir():
        return installed
    return _PACKAGE_DIR.parent


def path(*parts: str) -> Path:
    found = data_dir().joinpath(*parts)
    if not found.exists():
        raise FileNotFoundError(f"agentbox is installed without {'/'.join(parts)} (looked in {data_dir()})")
    return found


def text(*parts: str) -> str:
    return path(*parts).read_text(encoding="utf-8")
