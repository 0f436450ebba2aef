"""The attack tests run against real root servers, started as the end-to-end tests start theirs."""

from tests.e2e.conftest import db_url as db_url
from tests.e2e.conftest import make_server as make_server
