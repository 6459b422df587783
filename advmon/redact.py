"""Secrets never leave advmon: passwords and tokens are cut out of URLs and messages.

A sink configured with ``http://user:password@host`` or ``...?token=abc`` remembers
the secret parts (:func:`remember_secrets`); every message advmon warns, logs or
prints goes through :func:`scrub`, and every ``repr`` shows :func:`redact_url`.

Example:
    >>> redact_url("http://alice:hunter22@127.0.0.1:9091/path?token=abc123&job=x")
    'http://alice:***@127.0.0.1:9091/path?token=***&job=x'
    >>> remember_secrets("http://alice:hunter22@127.0.0.1:9091")
    >>> scrub("push to http://alice:hunter22@127.0.0.1:9091 failed: hunter22 refused")
    'push to http://alice:***@127.0.0.1:9091 failed: *** refused'
"""

from __future__ import annotations

import re
import threading
import urllib.parse

__all__ = ["redact_url", "remember_secret", "remember_secrets", "scrub", "split_credentials"]

_SENSITIVE = re.compile(r"(token|key|secret|password|passwd|pwd|auth|sig|signature|credential)", re.I)
_MASK = "***"
_secrets: set[str] = set()
_lock = threading.Lock()


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """``(url without user:password@, username, password)``."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None, None
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    clean = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return clean, urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or "")


def redact_url(url: str) -> str:
    """``url`` with its password and sensitive query values replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return scrub(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{_MASK}@{hostport}"
    query = "&".join(
        f"{name}={_MASK}" if _SENSITIVE.search(name) else (f"{name}={value}" if sep else name)
        for name, sep, value in (item.partition("=") for item in parts.query.split("&") if item)
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def remember_secret(secret: str | None) -> None:
    """Scrub ``secret`` from every message from now on (short strings are ignored)."""
    if secret and len(secret) >= 4:
        with _lock:
            _secrets.add(secret)
            _secrets.add(urllib.parse.quote(secret, safe=""))


def remember_secrets(url: str | None) -> None:
    """Remember the password and sensitive query values of ``url``."""
    if not url:
        return
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return
    remember_secret(urllib.parse.unquote(parts.password) if parts.password else None)
    for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        if _SENSITIVE.search(name):
            remember_secret(value)


def scrub(text: str) -> str:
    """``text`` with every remembered secret replaced by ``***``."""
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, _MASK)
    return text
