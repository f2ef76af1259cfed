"""The URLs in settings: a comma-separated node list split, and any URL masked for the logs."""

from __future__ import annotations

import re


def split_urls(value: str) -> list[str]:
    """The URLs of a comma-separated list (a comma inside a password is written `%2C`)."""
    return [part.strip() for part in value.split(",") if part.strip()]


def mask_url(url: str) -> str:
    """The URL with its password (in the user part or a `password=` parameter) as `***`, so it
    can be logged. Never raises: a URL it cannot parse comes back with everything between `//`
    and `@` masked."""
    masked = _USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:***@", url)
    return _PASSWORD_PARAM.sub(lambda m: f"{m.group(1)}***", masked)


_USERINFO = re.compile(r"(\w[\w+.-]*://)([^:/@?#]*):[^@/?#]*@")
_PASSWORD_PARAM = re.compile(r"((?:^|[?&;])password=)[^&;#]*", re.IGNORECASE)
