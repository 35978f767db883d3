"""Parsing --http-restricted-api / --grpc-restricted-protocol, and the header check."""

import pytest

from shmserve.extensions.restricted_api import RestrictionError, allowed, parse_restrictions


def test_categories_share_a_condition_and_header_names_have_no_case():
    parsed = parse_restrictions(["model-repository,logging:Admin-Key=s3cret",
                                 "inference:x-tenant=a"])
    assert parsed == {"model-repository": ("admin-key", "s3cret"),
                      "logging": ("admin-key", "s3cret"), "inference": ("x-tenant", "a")}
    assert allowed(parsed["logging"], [("ADMIN-KEY", "s3cret")])
    assert not allowed(parsed["logging"], [("admin-key", "S3CRET")])  # values do have case
    assert not allowed(parsed["logging"], [])


@pytest.mark.parametrize("value, fragment", [
    ("logging", "expected"), ("logging:key", "expected"), (":k=v", "expected"),
    ("nonsense:k=v", "unknown API category"),
])
def test_malformed_flags_are_refused(value, fragment):
    with pytest.raises(RestrictionError, match=fragment):
        parse_restrictions([value])


def test_a_category_restricted_twice_is_refused():
    with pytest.raises(RestrictionError, match="restricted twice"):
        parse_restrictions(["logging:a=1", "health,logging:b=2"])
