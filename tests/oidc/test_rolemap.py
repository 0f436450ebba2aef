"""Groups to roles: parsing, refusals with a clear message, strongest role, deterministic order, default deny."""

from __future__ import annotations

import pytest

from gpupool.services.oidc import Grant, RoleMap

ENTRIES = [
    "auditors=project:vision:viewer",
    "vision-team=project:vision:member",
    "research-leads=department:research:admin",
    "ml-admins=admin",
    "cn=nlp,ou=groups,dc=example=project:nlp:member",  # an LDAP DN: the group is what precedes the last '='
]


def test_entries_parse_into_grants() -> None:
    rm = RoleMap.parse(ENTRIES)
    assert rm.grants(["ml-admins"]) == [Grant("admin", None, "admin")]
    assert rm.grants(["research-leads"]) == [Grant("department", "research", "admin")]
    assert rm.grants(["cn=nlp,ou=groups,dc=example"]) == [Grant("project", "nlp", "member")]


def test_grants_are_sorted_deduplicated_and_keep_the_strongest_role() -> None:
    rm = RoleMap.parse([*ENTRIES, "ml-admins=project:vision:viewer", " vision-team = project:nlp:viewer "])
    groups = ["auditors", "vision-team", "cn=nlp,ou=groups,dc=example", "research-leads", "ml-admins"]
    expected = [
        Grant("admin", None, "admin"),
        Grant("department", "research", "admin"),
        Grant("project", "nlp", "member"),  # member beats viewer
        Grant("project", "vision", "member"),  # member beats the auditors' and ml-admins' viewer
    ]
    assert rm.grants(groups) == expected
    assert rm.grants(reversed(groups)) == expected  # the order of the groups does not matter


def test_default_deny() -> None:
    assert RoleMap().grants(["ml-admins", "anyone"]) == []
    assert RoleMap.parse([]).grants(["ml-admins"]) == []
    assert RoleMap.parse(["", "  "]).grants(["ml-admins"]) == []
    rm = RoleMap.parse(ENTRIES)
    assert rm.grants([]) == []
    assert rm.grants(["ML-Admins", "ml-admins ", "authors"]) == []  # groups match exactly


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("ml-admins", "a role mapping is GROUP=admin"),
        ("=admin", "a role mapping is GROUP=admin"),
        ("ml-admins=root", "after '=' comes admin, department:NAME:ROLE or project:NAME:ROLE, not 'root'"),
        ("ml-admins=", "after '=' comes admin"),
        ("g=project:vision", "after '=' comes admin"),
        ("g=team:vision:member", "after '=' comes admin"),
        ("g=project:vision:member:extra", "after '=' comes admin"),
        ("g=project:Vision:member", "'Vision' is not a project name"),
        ("g=department::admin", "'' is not a department name"),
        ("g=project:vision:owner", "the role 'owner' is not one of admin, member, viewer"),
        ("g=project:vision:", "the role '' is not one of admin, member, viewer"),
    ],
)
def test_bad_entries_are_refused_with_a_clear_message(entry: str, message: str) -> None:
    with pytest.raises(ValueError) as e:
        RoleMap.parse(["ml-admins=admin", entry])
    assert message in str(e.value)
    assert repr(entry.strip()) in str(e.value)  # it names the entry at fault
