"""`s3://bucket/key` URIs, apart from the S3 client: checking where a URI points needs no
boto3, which costs a process that never talks to S3 ~11 MB."""

from __future__ import annotations

import re

SCHEME = "s3://"
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/key` -> ("bucket", "some/key"); the key part may be ''."""
    if not uri.startswith(SCHEME):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[len(SCHEME) :].partition("/")
    if not _BUCKET.fullmatch(bucket):
        raise ValueError(f"s3:// URI has no valid bucket name: {uri!r}")
    return bucket, key
