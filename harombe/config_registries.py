"""``network.allowed_registries`` entries: http(s) index URLs, or bare host names that limit
where downloads may come from (see :class:`harombe.config.NetworkConfig`)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

#: The longest registry URL accepted, and how many a registry may list: they travel in one
#: environment variable, which Linux caps at 128 KiB.
MAX_REGISTRY_URL_CHARS = 2048
MAX_REGISTRY_URLS = 16


#: A bare host name (``files.example.org``) or IPv4 address: an allowed download host.
HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$",
    re.IGNORECASE,
)


def is_host_name(entry: str) -> bool:
    """Whether an ``allowed_registries`` entry is a bare host name rather than a URL."""
    return bool(HOST_NAME.match(entry)) and entry.isascii()


def registry_entry(registry: str, url: object) -> str:
    """``url`` if it is a plain http(s) URL pip / npm can be given as one argument, or a bare
    host name (lower-cased)."""
    text = url if isinstance(url, str) else ""
    if is_host_name(text):
        return text.lower()
    if len(text) > MAX_REGISTRY_URL_CHARS:
        raise ValueError(
            f"allowed_registries.{registry} holds a URL of {len(text)} characters, over "
            f"{MAX_REGISTRY_URL_CHARS}; give the index's plain URL"
        )
    # pip reads several extra index URLs from one space-separated variable: no spaces inside.
    plain = text.isprintable() and not any(c.isspace() for c in text)
    try:
        parts = urlsplit(text) if plain else None
    except ValueError:  # e.g. an unclosed IPv6 bracket
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"allowed_registries.{registry} holds {str(url)[:80]!r}, which is neither an "
            "http(s) URL nor a host name; write the index's full URL, e.g. "
            "https://mirror.example/simple, or a host downloads may come from, e.g. "
            "files.example.org"
        )
    return text


def url_host(url: str) -> str:
    """The lower-cased host of an http(s) URL entry ("" for a host name entry)."""
    return (urlsplit(url).hostname or "").lower() if "://" in url else ""
