"""API object names as the API server defines them: what reaches a URL path."""

from __future__ import annotations

import pytest

from ate_devplugin.dra.names import InvalidNameError, check_name, check_namespace

GOOD_NAMES = ["a", "kvm-claim-x7k2p", "node-a.example.com", "0", "a" * 253, "a-b.c-d"]
BAD_NAMES = [
    "", "..", ".", "a/b", "../x", "a/../b", "A", "a_b", "-a", "a-", "a..b", ".a", "a.", "a b", "a%2fb",
    "a" * 254, "ä", "a\nb", "a?b", "a#b",
]  # fmt: skip


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_dns_subdomains_are_names(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", BAD_NAMES)
def test_anything_else_is_refused_saying_why(name: str) -> None:
    with pytest.raises(InvalidNameError, match=r"claim .* is not a valid object name \(DNS-1123 subdomain\)"):
        check_name(name, "claim")


@pytest.mark.parametrize("namespace", ["default", "kube-system", "a", "a" * 63])
def test_dns_labels_are_namespaces(namespace: str) -> None:
    assert check_namespace(namespace) == namespace


@pytest.mark.parametrize("namespace", ["", "..", "a.b", "a/b", "A", "a" * 64, "-a"])
def test_a_namespace_has_no_dots_or_slashes(namespace: str) -> None:
    with pytest.raises(InvalidNameError, match="is not a valid namespace"):
        check_namespace(namespace)


def test_a_long_bad_name_is_cut_in_the_error() -> None:
    with pytest.raises(InvalidNameError) as caught:
        check_name("/" * 100_000)
    assert len(str(caught.value)) < 200
