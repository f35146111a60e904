"""Passwords out of everything printed: URLs are shown with ``***`` for their password.

``mask_url`` masks one URL (``postgresql://u:secret@h/db`` -> ``postgresql://u:***@h/db``;
also a ``password=`` query parameter); ``mask_secrets`` masks every such URL inside a text
(an error message, a log line). The log set-up (:func:`prorsa_runtime.logs.setup_logging`)
passes every line through ``mask_secrets``; CLI errors that quote a URL or a driver's
message mask it first.
"""

from __future__ import annotations

import re

# scheme://user:password@  (up to the LAST '@' before a '/' or whitespace, as URL parsers read it)
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)(?P<pw>[^\s/]*)(?=@)")
_QUERY_PW = re.compile(r"(?P<head>[?&](?:password|passwd|pwd)=)(?P<pw>[^&\s'\"]*)", re.IGNORECASE)

MASK = "***"


def mask_secrets(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    if "://" not in text and "password" not in text.lower():
        return text
    text = _USERINFO.sub(lambda m: m.group("head") + (MASK if m.group("pw") else ""), text)
    return _QUERY_PW.sub(lambda m: m.group("head") + MASK, text)


def mask_url(url: str) -> str:
    """One URL as it may be shown: its password (userinfo or ``password=``) replaced by ``***``."""
    return mask_secrets(url)
