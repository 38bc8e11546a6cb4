"""Back-office accounts: argon2id password hashes, a role, and an optional tenant."""

from __future__ import annotations

from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from ocrfleet.db.models import User

ROLES = ("reviewer", "admin")
_hasher = PasswordHasher()
# Verified when the name is unknown, so a login takes as long whether or not it exists.
_DUMMY_HASH = _hasher.hash("not a password")


@dataclass(frozen=True)
class Account:
    """Who is logged in: what every query is scoped by."""

    id: int
    name: str
    role: str
    tenant: str | None  # None: every tenant


def add_user(
    session: Session, name: str, password: str, role: str, tenant: str | None = None
) -> Account:
    """Create an account; a name that exists is an error, not an update."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    if not name or len(name) > 100:
        raise ValueError("a user name has 1 to 100 characters")
    if len(password) < 8:
        raise ValueError("a password has at least 8 characters")
    if session.scalar(select(User.id).where(User.name == name)) is not None:
        raise ValueError(f"user {name!r} exists")
    user = User(name=name, password_hash=_hasher.hash(password), role=role, tenant=tenant)
    session.add(user)
    session.flush()
    return Account(id=user.id, name=name, role=role, tenant=tenant)


def authenticate(session: Session, name: str, password: str) -> Account | None:
    """The account when the password is right, else None (same cost either way)."""
    user = session.scalars(select(User).where(User.name == name)).one_or_none()
    try:
        _hasher.verify(user.password_hash if user else _DUMMY_HASH, password)
    except (VerificationError, InvalidHashError):
        return None
    if user is None:
        return None
    return Account(id=user.id, name=user.name, role=user.role, tenant=user.tenant)


def get_account(session: Session, user_id: int) -> Account | None:
    user = session.get(User, user_id)
    if user is None:
        return None
    return Account(id=user.id, name=user.name, role=user.role, tenant=user.tenant)
