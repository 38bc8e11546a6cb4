"""Where submitted objects may come from, so the fleet's credentials read only what the
operator pointed them at.

- **The fleet** (workers, every submitter) reads `s3://` objects only in the store
  (`OCRFLEET_STORE_URL`), under the intake prefix (`OCRFLEET_INTAKE_PREFIX`) and under the
  entries of `OCRFLEET_SOURCE_ALLOW` (an entry with `{tenant}`: its part before that
  segment). `read_uri` refuses anything else before a request leaves the process.
- **A tenant** (an API key) names only objects under its own intake prefix,
  `<store>/intake/<tenant>/`, and under the allow-list's entries with `{tenant}` replaced
  by its name; an entry without `{tenant}` is open to every tenant. A tenant whose name is
  not a single key segment has no intake prefix. Keys are checked by the store's key rules
  (no `..`, `//`, backslash or control character), so no key leaves its prefix.

The layout shares `intake/` with uploads, which the client stores at `intake/<sha256>`
(one segment); tenants' objects are always two segments or more below it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ocrfleet.config import Settings
from ocrfleet.storage.base import AccessDenied, InvalidKey
from ocrfleet.storage.keys import validate_key
from ocrfleet.storage.s3_uris import SCHEME, parse_s3_uri

TENANT = "{tenant}"
INTAKE = "intake"


class SourceRefused(AccessDenied):
    """An object outside everything the fleet, or this tenant, may read."""


@dataclass(frozen=True)
class Entry:
    """One place objects may come from: `s3://bucket/before{tenant}after`."""

    text: str
    bucket: str
    before: str  # key prefix up to `{tenant}`, or the whole prefix: "" or ending in "/"
    after: str  # key prefix after the `{tenant}` segment: "" or ending in "/"
    per_tenant: bool

    def for_tenant(self, tenant: str) -> tuple[str, str] | None:
        """(bucket, key prefix) of this entry for `tenant`; None if the tenant's name is
        not a single key segment."""
        if not self.per_tenant:
            return self.bucket, self.before
        if not _segment(tenant):
            return None
        return self.bucket, f"{self.before}{tenant}/{self.after}"

    def tenant_in(self, bucket: str, key: str) -> str | None:
        """The tenant whose part of this entry holds `key`, if any."""
        if not self.per_tenant or bucket != self.bucket or not key.startswith(self.before):
            return None
        tenant, _, rest = key[len(self.before) :].partition("/")
        if _segment(tenant) and rest.startswith(self.after) and rest != self.after:
            return tenant
        return None


def _segment(name: str) -> bool:
    try:
        validate_key(name)
    except InvalidKey:
        return False
    return "/" not in name


def parse_entry(text: str) -> Entry:
    """An allow-list entry (`s3://bucket[/prefix]`, `{tenant}` at most once, as a whole
    segment); ValueError saying what is wrong."""
    text = text.strip()
    try:
        bucket, key = parse_s3_uri(text)
    except ValueError:
        raise ValueError(f"source {text!r} is not s3://bucket[/prefix]") from None
    key = key.strip("/")
    segments = key.split("/") if key else []
    if segments.count(TENANT) > 1 or any(TENANT in s and s != TENANT for s in segments):
        raise ValueError(f"source {text!r}: {TENANT} may stand once, as a whole segment")
    if key:
        try:
            validate_key(key.replace(TENANT, "t"))
        except InvalidKey as exc:
            raise ValueError(f"source {text!r}: {exc}") from None
    if TENANT in segments:
        at = segments.index(TENANT)
        before, after = segments[:at], segments[at + 1 :]
        return Entry(
            f"{SCHEME}{bucket}/{key}", bucket, _prefix(before), _prefix(after), per_tenant=True
        )
    shown = f"{SCHEME}{bucket}/{key}" if key else f"{SCHEME}{bucket}"
    return Entry(shown, bucket, _prefix(segments), "", per_tenant=False)


def _prefix(segments: list[str]) -> str:
    return "".join(f"{s}/" for s in segments)


def _store_entries(settings: Settings) -> list[Entry]:
    """The store itself and its tenants' intake parts, when the store is on S3."""
    if not settings.store_url.startswith(SCHEME):
        return []
    bucket, prefix = parse_s3_uri(settings.store_url)
    root = _prefix([s for s in prefix.strip("/").split("/") if s])
    return [
        Entry(settings.store_url, bucket, root, "", per_tenant=False),
        Entry(settings.store_url, bucket, f"{root}{INTAKE}/", "", per_tenant=True),
    ]


def _split(uri: str) -> tuple[str, str]:
    """(bucket, key) of an object URI, the key checked by the store's rules."""
    try:
        bucket, key = parse_s3_uri(uri)
        return bucket, validate_key(key)
    except ValueError as exc:  # InvalidKey is a ValueError too
        raise SourceRefused(f"{uri[:200]!r} is not an object URI: {exc}") from None


def _inside(bucket: str, key: str, place: tuple[str, str]) -> bool:
    return bucket == place[0] and key.startswith(place[1]) and key != place[1]


def fleet_may_read(uri: str, settings: Settings) -> bool:
    """Whether `uri` (s3://) is in the store, the intake prefix or an allowed source."""
    try:
        bucket, key = _split(uri)
    except SourceRefused:
        return False
    places = [(e.bucket, e.before) for e in _store_entries(settings)]
    places += [(e.bucket, e.before) for e in map(parse_entry, settings.source_allow)]
    intake = settings.intake_prefix
    if intake and intake.startswith(SCHEME):
        entry = parse_entry(intake)
        places.append((entry.bucket, entry.before))
    return any(_inside(bucket, key, place) for place in places)


def tenant_places(tenant: str, settings: Settings) -> list[tuple[str, str]]:
    """(bucket, key prefix) of every place `tenant` may name objects in."""
    entries = [e for e in _store_entries(settings) if e.per_tenant]
    entries += [parse_entry(text) for text in settings.source_allow]
    places = [entry.for_tenant(tenant) for entry in entries]
    return [place for place in places if place is not None]


def confine(uri: str, tenant: str, settings: Settings) -> str:
    """`uri` if `tenant` may name it, else SourceRefused. Nothing is read."""
    bucket, key = _split(uri)
    if not any(_inside(bucket, key, place) for place in tenant_places(tenant, settings)):
        raise SourceRefused(f"{uri[:200]!r} is outside tenant {tenant[:128]!r}'s sources")
    return f"{SCHEME}{bucket}/{key}"


def tenant_of(uri: str, settings: Settings) -> str | None:
    """The tenant whose intake prefix (or `{tenant}` source) holds `uri`, if any: the
    intake sweep submits such an object as that tenant's."""
    if not uri.startswith(SCHEME):
        return None
    try:
        bucket, key = _split(uri)
    except SourceRefused:
        return None
    entries = [e for e in _store_entries(settings) if e.per_tenant]
    entries += [parse_entry(text) for text in settings.source_allow]
    for entry in entries:
        tenant = entry.tenant_in(bucket, key)
        if tenant is not None:
            return tenant
    return None
