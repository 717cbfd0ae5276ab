"""Authentication: DRF tokens as ``Token <key>`` or ``Bearer <key>``, and the browser session."""
from __future__ import annotations

from django.conf import settings
from rest_framework import exceptions
from rest_framework import HTTP_HEADER_ENCODING
from rest_framework.authentication import TokenAuthentication

from core.refreshing_cache import RefreshingCache, seconds_setting

# token key -> its user. Every streaming request authenticates; a token rarely changes. Deleting a
# token or saving its user clears this at once in this process (the wiring below). Past
# AUTH_TOKEN_CACHE_SECONDS the user is served once more while a background thread reloads it
# (core/refreshing_cache.py: no request waits on that query; a reload that finds the token gone or
# its user inactive drops the entry, and the next request is refused): other processes honour a
# revocation within AUTH_TOKEN_CACHE_SECONDS and the next use after it.
_TOKENS: RefreshingCache[object] = RefreshingCache(
    "auth token", ttl=seconds_setting("AUTH_TOKEN_CACHE_SECONDS"), secret_keys=True)


def token_cache_clear(**_: object) -> None:
    _TOKENS.clear()


class BearerOrTokenAuthentication(TokenAuthentication):
    """Accepts ``Authorization: Token <key>`` and ``Authorization: Bearer <key>``."""

    keywords = (b"token", b"bearer")

    def authenticate(self, request):
        auth = _authorization_header(request).split()
        if not auth or auth[0].lower() not in self.keywords:
            return None
        if len(auth) != 2:
            raise exceptions.AuthenticationFailed("Invalid token header: expected '<scheme> <key>'.")
        try:
            key = auth[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("Invalid token header: the key has invalid characters.")
        return self.authenticate_credentials(key)

    def authenticate_credentials(self, key):
        if float(getattr(settings, "AUTH_TOKEN_CACHE_SECONDS", 0) or 0) <= 0:
            return super().authenticate_credentials(key)
        user = _TOKENS.get(key, lambda: super(BearerOrTokenAuthentication, self).authenticate_credentials(key)[0])
        # A copy per request: per-instance caches (permissions) must not leak between requests.
        return _copy_user(user), key


def _authorization_header(request) -> bytes:
    """DRF's ``get_authorization_header`` read from ``META`` (the header's WSGI name), as DRF
    itself did before 3.15: ``request.headers`` builds a case-insensitive copy of every header,
    half of a stream request's authentication time, to read this one."""
    auth = request.META.get("HTTP_AUTHORIZATION", b"")
    if isinstance(auth, str):
        auth = auth.encode(HTTP_HEADER_ENCODING)
    return auth


def _copy_user(user: object) -> object:
    """A cached user for one request: the same field values in a new instance with a model state of
    its own (what ``copy.copy`` gives through ``Model.__getstate__``, without ``copy.copy``'s
    generic machinery for the state: with cold caches, at one stream at a time, that was 47 µs of
    the 115 µs a token authentication took). Nothing set on the copy (permission caches, related
    objects) reaches the cached user or another request's copy."""
    clone = object.__new__(type(user))  # type: ignore[call-overload]
    values = user.__dict__.copy()
    cached_state = values["_state"]
    state = object.__new__(type(cached_state))
    state.__dict__.update(cached_state.__dict__)
    related = cached_state.__dict__.get("fields_cache")
    if related is not None:
        state.fields_cache = dict(related)
    values["_state"] = state
    clone.__dict__ = values
    return clone


def _connect_cache_invalidation() -> None:
    from django.db.models.signals import post_delete, post_save

    post_delete.connect(token_cache_clear, sender="authtoken.Token", dispatch_uid="token-cache-delete")
    post_save.connect(token_cache_clear, sender="authtoken.Token", dispatch_uid="token-cache-save")
    post_save.connect(token_cache_clear, sender=settings.AUTH_USER_MODEL, dispatch_uid="token-cache-user")


_connect_cache_invalidation()
