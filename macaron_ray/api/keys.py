"""API keys, kept as salted hashes: the plain keys are never on disk in a deployment.

A keys file (or the Secret or env var holding one) has a line per key:

    <tenant> sha256:<salt, 32 hex>:<sha256(salt + key), 64 hex>

`macaron keys new --tenant NAME` makes a key and prints it once, with its line.
Each tenant may have several lines (a rotation: old and new key at once); its
stored state follows the tenant, not the key.

SHA-256 rather than a slow password hash: keys are 256-bit random tokens (a key
shorter than `MIN_KEY_CHARS` is refused), so a slow hash would add nothing but
its cost to every request, and make an unknown key a cheap way to burn CPU.
A presented key is compared against every line with `hmac.compare_digest`,
without stopping at a match, so the time taken says nothing about which line
or how much of it matched.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

MIN_KEY_CHARS = 24
TENANT_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
_LINE = re.compile(rf"^({TENANT_PATTERN})\s+sha256:([0-9a-f]{{32}}):([0-9a-f]{{64}})$")


class KeysError(ValueError):
    """A keys file that cannot be used. Its message names line numbers, never a line's content."""


def _digest(salt: bytes, key: str) -> bytes:
    return hashlib.sha256(salt + key.encode("utf-8", "surrogatepass")).digest()


def new_key() -> str:
    return "mk-" + secrets.token_urlsafe(32)


def hash_line(tenant: str, key: str, salt: bytes | None = None) -> str:
    """The keys-file line of `key` for `tenant`."""
    if not re.fullmatch(TENANT_PATTERN, tenant):
        raise KeysError(f"tenant names are 1-64 characters of [A-Za-z0-9._-], starting alphanumeric")
    if len(key) < MIN_KEY_CHARS or any(c.isspace() for c in key):
        raise KeysError(f"an API key must be at least {MIN_KEY_CHARS} characters without spaces "
                        f"(`macaron keys new` makes one)")
    salt = salt if salt is not None else secrets.token_bytes(16)
    return f"{tenant} sha256:{salt.hex()}:{_digest(salt, key).hex()}"


@dataclass(frozen=True)
class _Entry:
    tenant: str
    salt: bytes
    digest: bytes


class KeyRing:
    """The accepted keys, as hashes; `tenant_of(key)` says whose key it is."""

    def __init__(self, entries: list[_Entry]):
        if not entries:
            raise KeysError("the keys file has no key: every request would be refused")
        self._entries = tuple(entries)

    @classmethod
    def parse(cls, text: str, source: str = "keys") -> "KeyRing":
        entries = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            match = _LINE.match(line)
            if match is None:
                raise KeysError(f"{source}, line {number}: not '<tenant> sha256:<salt>:<hash>' (plain keys are "
                                f"not accepted: `macaron keys new` or `macaron keys hash` makes the line)")
            tenant, salt, digest = match.groups()
            entries.append(_Entry(tenant, bytes.fromhex(salt), bytes.fromhex(digest)))
        return cls(entries)

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(e.tenant for e in self._entries)

    def tenant_of(self, key: str | None) -> str | None:
        """The tenant whose key `key` is, or None. Every line is checked, in constant time each."""
        if not key:
            return None
        found = None
        for entry in self._entries:
            if hmac.compare_digest(_digest(entry.salt, key), entry.digest) and found is None:
                found = entry.tenant
        return found
