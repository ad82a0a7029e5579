"""Bearer tokens: the token file, and who owns what.

The token file holds one token per line (blank lines and ``#`` comments are skipped). It is
refused if its group or others may read it, and it is read again on SIGHUP: a token taken
out stops working at once (its sandboxes live on to their TTL, reachable by no one), a token
added works at once. A sandbox belongs to the token that created it; the service keeps
only a digest of each token (``owner``), never the token itself, in memory and on disk.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
from pathlib import Path

from sandfleet.errors import ConfigError

log = logging.getLogger(__name__)

MIN_TOKEN_LEN = 16
"""Shorter tokens are refused: a token is a password, guessable ones are no boundary."""


def owner_of(token: str) -> str:
    """The owner id of a token: a digest, so markers and logs never hold a token."""
    return hashlib.sha256(token.encode()).hexdigest()[:24]


def read_token_file(path: Path) -> dict[str, str]:
    """owner id -> token, from a file only its owner may read; ConfigError naming the problem."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"token file {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"token file {path} is not a regular file")
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"token file {path} is readable or writable by others "
                              f"(mode {stat.S_IMODE(st.st_mode):o}): chmod 600 {path}")
        with os.fdopen(fd, "r", closefd=False) as f:
            text = f.read()
    finally:
        os.close(fd)
    tokens: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if len(line) < MIN_TOKEN_LEN or any(c.isspace() for c in line):
            raise ConfigError(f"token file {path}, line {n}: a token is one word of at least "
                              f"{MIN_TOKEN_LEN} characters")
        tokens[owner_of(line)] = line
    if not tokens:
        raise ConfigError(f"token file {path} holds no token (one per line)")
    return tokens


class Tokens:
    """The tokens in force; ``reload()`` swaps them atomically or keeps the old ones."""

    def __init__(self, path: Path):
        self.path = path
        self._tokens = read_token_file(path)

    def reload(self) -> bool:
        """Read the file again (SIGHUP). A file that is now bad keeps the old tokens, logged."""
        try:
            self._tokens = read_token_file(self.path)
        except ConfigError as e:
            log.error("token file not reloaded, the old tokens stay in force: %s", e)
            return False
        log.info("token file reloaded: %d tokens", len(self._tokens))
        return True

    def owner(self, authorization: str | None) -> str | None:
        """The owner id for an ``Authorization: Bearer <token>`` header, None if not valid."""
        if not authorization:
            return None
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        oid = owner_of(token)
        known = self._tokens.get(oid)
        if known is None or not hmac.compare_digest(known.encode(), token.encode()):
            return None
        return oid
