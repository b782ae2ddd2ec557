"""API keys in the OS keyring, through `keyring` with a small real backend kept in memory, and without any."""

from __future__ import annotations

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import fail, null
from keyring.errors import PasswordDeleteError, PasswordSetError

from app.service.api_keys import (
    NO_KEYRING_NOTE,
    SERVICE,
    delete_api_key,
    keyring_available,
    load_api_key,
    save_api_key,
)

ENDPOINT = "http://gpu-box:8000/v1"


class MemoryKeyring(KeyringBackend):
    """A keyring backend that keeps secrets in a dict: what an OS keyring does, for one process."""

    priority = 1

    def __init__(self):
        super().__init__()
        self.secrets: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        return self.secrets.get((service, username))

    def set_password(self, service, username, password):
        self.secrets[(service, username)] = password

    def delete_password(self, service, username):
        if self.secrets.pop((service, username), None) is None:
            raise PasswordDeleteError("no such password")


class LockedKeyring(MemoryKeyring):
    def set_password(self, service, username, password):
        raise PasswordSetError("the keyring is locked")


@pytest.fixture
def use_keyring():
    """Set keyring's backend for one test, and put the one it had back afterwards."""
    previous = keyring.get_keyring()
    yield keyring.set_keyring
    keyring.set_keyring(previous)


def test_keys_are_kept_in_the_keyring_per_endpoint(use_keyring):
    store = MemoryKeyring()
    use_keyring(store)
    assert keyring_available()
    assert save_api_key(ENDPOINT, "sk-one").in_keyring
    assert save_api_key("http://other:8080/v1", "sk-two").note == ""
    assert store.secrets[(SERVICE, ENDPOINT)] == "sk-one"
    assert load_api_key(ENDPOINT) == "sk-one" and load_api_key("http://other:8080/v1") == "sk-two"
    delete_api_key(ENDPOINT)
    delete_api_key(ENDPOINT)  # a second delete finds nothing and says nothing
    assert load_api_key(ENDPOINT) is None and load_api_key("http://other:8080/v1") == "sk-two"


@pytest.mark.parametrize("backend", [fail.Keyring, null.Keyring])
def test_without_a_keyring_the_key_must_go_in_the_settings_with_a_note(use_keyring, backend):
    use_keyring(backend())
    assert not keyring_available()
    place = save_api_key(ENDPOINT, "sk-one")
    assert not place.in_keyring and place.note == NO_KEYRING_NOTE and "plain text" in place.note
    assert load_api_key(ENDPOINT) is None
    delete_api_key(ENDPOINT)


def test_a_keyring_that_refuses_says_so(use_keyring):
    use_keyring(LockedKeyring())
    place = save_api_key(ENDPOINT, "sk-one")
    assert not place.in_keyring and "the keyring is locked" in place.note and "settings" in place.note
