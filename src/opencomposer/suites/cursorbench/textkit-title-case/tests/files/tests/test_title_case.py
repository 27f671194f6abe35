import pytest
import textkit
from textkit import case, render


@pytest.mark.parametrize(
    ("identifier", "expected"),
    [
        ("created_at", "Created At"),
        ("userId", "User Id"),
        ("ORDER_TOTAL", "Order Total"),
        ("shipping-address-line-2", "Shipping Address Line 2"),
        ("", ""),
    ],
    ids=["snake", "camel", "constant", "kebab-digits", "empty"],
)
def test_to_title(identifier, expected):
    assert case.to_title(identifier) == expected


def test_acronyms_follow_the_other_converters():
    # either spelling is a reasonable heading; splitting must match split_words
    assert case.to_title("parseHTTPResponse") in ("Parse Http Response", "Parse HTTP Response")


def test_round_trips_to_snake():
    for name in ["user_id", "max_retry_count", "html_to_pdf"]:
        assert case.to_snake(case.to_title(name)) == name


def test_exported_from_the_package():
    assert textkit.to_title is case.to_title


def test_existing_title_filter_is_unchanged():
    assert render("{{ s|title }}", s="ada lovelace's notes") == "Ada Lovelace's Notes"
