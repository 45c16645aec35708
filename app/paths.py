"""Where chatloom keeps its files: the per-user data directory of the default SQLite store.

The default used to be ./data/chatloom.db, relative to the working directory: a server started from
another folder silently found no sessions. The per-user folder follows each system's convention
(the XDG base directories on Linux; CHATLOOM_DATA_DIR or --data-dir names another, and
CHATLOOM_DATABASE_URL / --database-url still name the store itself)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

APP_NAME = "chatloom"


def user_data_dir() -> Path:
    """The per-user data folder: $XDG_DATA_HOME/chatloom or ~/.local/share/chatloom on Linux,
    ~/Library/Application Support/chatloom on macOS, %LOCALAPPDATA%\\chatloom on Windows."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / APP_NAME
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / APP_NAME
    xdg = os.environ.get("XDG_DATA_HOME", "").strip()
    # the XDG spec: a relative $XDG_DATA_HOME is invalid and is ignored
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / APP_NAME


def sqlite_url(folder: Path) -> str:
    """The SQLite URL of the conversation store inside `folder` (an absolute path)."""
    return f"sqlite:///{Path(folder).expanduser().absolute() / 'chatloom.db'}"


def default_database_url() -> str:
    """The store when nothing names one: CHATLOOM_DATA_DIR's, else the per-user folder's."""
    named = os.environ.get("CHATLOOM_DATA_DIR", "").strip()
    return sqlite_url(Path(named) if named else user_data_dir())
