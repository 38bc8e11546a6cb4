"""Back-office accounts: argon2id password hashes, a role, a tenant scope, and a session
generation that logout, disable and a password change bump to void every cookie."""

from __future__ import annotations

from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from ocrfleet.db.models import Review, User, utcnow

ROLES = ("reviewer", "admin")
GLOBAL = "*"  # the tenant of an account that sees every tenant's documents
MAX_NAME = 100
MAX_PASSWORD = 1024  # longer is refused before hashing
_hasher = PasswordHasher()
# Verified when the name is unknown, so a login takes as long whether or not it exists.
_DUMMY_HASH = _hasher.hash("not a password")


@dataclass(frozen=True)
class Account:
    """Who is logged in: what every query is scoped by."""

    id: int
    name: str
    role: str
    tenant: str | None  # GLOBAL: every tenant; None: only documents without a tenant
    generation: int = 0

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def scope(self) -> str:
        """The documents the account sees, in words (`users list`, the page header)."""
        if self.tenant == GLOBAL:
            return "every tenant"
        return f"tenant {self.tenant}" if self.tenant else "documents without a tenant"


def _account(user: User) -> Account:
    return Account(user.id, user.name, user.role, user.tenant, user.session_generation)


def _check_password(password: str) -> None:
    if not 8 <= len(password) <= MAX_PASSWORD:
        raise ValueError(f"a password has 8 to {MAX_PASSWORD} characters")


def add_user(
    session: Session, name: str, password: str, role: str, tenant: str | None = None
) -> Account:
    """Create an account; a name that exists is an error, not an update."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    if not name or len(name) > MAX_NAME or not name.isprintable():
        raise ValueError(f"a user name has 1 to {MAX_NAME} printable characters")
    if tenant is not None and (not tenant or len(tenant) > 100 or not tenant.isprintable()):
        raise ValueError("a tenant has 1 to 100 printable characters")
    _check_password(password)
    if session.scalar(select(User.id).where(User.name == name)) is not None:
        raise ValueError(f"user {name!r} exists")
    user = User(name=name, password_hash=_hasher.hash(password), role=role, tenant=tenant)
    session.add(user)
    session.flush()
    return _account(user)


def authenticate(session: Session, name: str, password: str) -> Account | None:
    """The account when the password is right and it is not disabled, else None (the same
    cost either way)."""
    user = session.scalars(select(User).where(User.name == name)).one_or_none()
    try:
        _hasher.verify(user.password_hash if user else _DUMMY_HASH, password)
    except (VerificationError, InvalidHashError):
        return None
    if user is None or user.disabled_at is not None:
        return None
    return _account(user)


def get_account(session: Session, user_id: int, generation: int) -> Account | None:
    """The account a session cookie names, if that cookie is still valid: the account
    exists, is not disabled, and no logout, disable or password change came after it."""
    user = session.get(User, user_id)
    if user is None or user.disabled_at is not None or user.session_generation != generation:
        return None
    return _account(user)


def _user(session: Session, name: str) -> User:
    user = session.scalars(select(User).where(User.name == name)).one_or_none()
    if user is None:
        raise LookupError(f"no user {name!r}")
    return user


def revoke_sessions(session: Session, user_id: int) -> None:
    """Void every session cookie of the account (logout logs out everywhere)."""
    session.execute(
        update(User)
        .where(User.id == user_id)
        .values(session_generation=User.session_generation + 1)
    )


def disable_user(session: Session, name: str) -> None:
    """No more logins, and every open session ends; the history keeps the name."""
    user = _user(session, name)
    user.disabled_at = user.disabled_at or utcnow()
    revoke_sessions(session, user.id)


def enable_user(session: Session, name: str) -> None:
    """Logins allowed again (sessions voided by the disable stay void)."""
    _user(session, name).disabled_at = None


def set_password(session: Session, name: str, password: str) -> None:
    """A new password; every open session ends (a disabled account stays disabled)."""
    _check_password(password)
    user = _user(session, name)
    user.password_hash = _hasher.hash(password)
    revoke_sessions(session, user.id)


def remove_user(session: Session, name: str) -> None:
    """Delete an account that never decided anything; one with reviews is kept for the
    history (disable it instead)."""
    user = _user(session, name)
    reviews = session.scalar(select(func.count(Review.id)).where(Review.reviewer_id == user.id))
    if reviews:
        raise ValueError(
            f"user {name!r} made {reviews} review(s), which name them: "
            f"`ocrfleet users disable {name}` instead"
        )
    session.execute(delete(User).where(User.id == user.id))


@dataclass(frozen=True)
class Listed:
    name: str
    role: str
    scope: str
    disabled: bool


def list_users(session: Session) -> list[Listed]:
    return [
        Listed(u.name, u.role, _account(u).scope, u.disabled_at is not None)
        for u in session.scalars(select(User).order_by(User.name)).all()
    ]
