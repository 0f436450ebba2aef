"""The real Dex of the single sign-on tests, for a login that spans a server's restart."""

from tests.oidc.conftest import dex_exe, start_dex

__all__ = ["dex_exe", "start_dex"]
