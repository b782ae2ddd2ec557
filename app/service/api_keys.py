"""API keys of remote endpoints, kept in the OS keyring (macOS Keychain, Windows Credential Locker, the Secret
Service on Linux desktops) when the `keyring` package finds one.

Where it finds none (a headless Linux box, a minimal desktop), the key has to go in Tandem's settings, in
plain text: `save_api_key` says so with `KeyPlace.note`, which the model manager shows beside the key
field, so the user knows and can choose.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

SERVICE = "Tandem remote endpoint"  # the keyring's service name; the endpoint's base URL is the user name

NO_KEYRING_NOTE = (
    "No system keyring was found, so this API key is saved in Tandem's settings in plain text. Install and "
    "unlock a keyring (for example GNOME Keyring or KWallet) to keep it there instead."
)


@dataclass(frozen=True)
class KeyPlace:
    """Where a key went: `in_keyring`, or not, and then `note` says why and that the settings must hold it."""

    in_keyring: bool
    note: str = ""


def keyring_available() -> bool:
    """True when keyring's chosen backend really stores secrets (not its fail or null backend)."""
    return _backend() is not None


def save_api_key(endpoint: str, key: str) -> KeyPlace:
    """Store `key` for `endpoint` (its base URL) in the OS keyring. When there is no usable keyring, or it
    refuses (locked, no permission), nothing is stored and the returned note says the settings must hold it."""
    backend = _backend()
    if backend is None:
        return KeyPlace(False, NO_KEYRING_NOTE)
    from keyring.errors import KeyringError

    try:
        backend.set_password(SERVICE, endpoint, key)
    except KeyringError as e:
        log.warning("the keyring refused the key for %s: %s", endpoint, e)
        return KeyPlace(False, f"The system keyring refused the API key ({e}); it is saved in Tandem's settings.")
    return KeyPlace(True)


def load_api_key(endpoint: str) -> str | None:
    """The key stored for `endpoint`, or None (none stored, or no usable keyring: look in the settings)."""
    backend = _backend()
    if backend is None:
        return None
    from keyring.errors import KeyringError

    try:
        return backend.get_password(SERVICE, endpoint)
    except KeyringError as e:
        log.warning("cannot read the key for %s from the keyring: %s", endpoint, e)
        return None


def delete_api_key(endpoint: str) -> None:
    """Forget the key stored for `endpoint`; nothing happens when none is stored or there is no keyring."""
    backend = _backend()
    if backend is None:
        return
    from keyring.errors import KeyringError, PasswordDeleteError

    try:
        backend.delete_password(SERVICE, endpoint)
    except PasswordDeleteError:
        pass  # there was none
    except KeyringError as e:
        log.warning("cannot delete the key for %s from the keyring: %s", endpoint, e)


def _backend():
    """keyring's chosen backend when it can store secrets, else None. Imported on first use: finding the
    backends reads entry points, which the app's start need not wait for."""
    try:
        import keyring
        from keyring.backends import fail, null
    except ImportError:  # a packaged build without keyring: the settings hold the key
        return None
    backend = keyring.get_keyring()
    if isinstance(backend, (fail.Keyring, null.Keyring)) or backend.priority <= 0:
        return None
    return backend
