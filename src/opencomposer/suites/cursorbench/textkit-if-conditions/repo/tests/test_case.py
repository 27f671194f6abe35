import pytest

from textkit.case import detect_case, split_words, to_camel, to_constant, to_kebab, to_pascal, to_snake


@pytest.mark.parametrize(
    ("identifier", "expected"),
    [
        ("parseHTTPResponse", ["parse", "HTTP", "Response"]),
        ("XMLHttpRequest", ["XML", "Http", "Request"]),
        ("snake_case_name", ["snake", "case", "name"]),
        ("kebab-case-name", ["kebab", "case", "name"]),
        ("CONSTANT_NAME", ["CONSTANT", "NAME"]),
        ("version2Update", ["version", "2", "Update"]),
        ("  spaced   words ", ["spaced", "words"]),
        ("", []),
    ],
    ids=["camel-acronym", "pascal-acronym", "snake", "kebab", "constant", "digits", "spaces", "empty"],
)
def test_split_words(identifier, expected):
    assert split_words(identifier) == expected


def test_conversions():
    assert to_snake("parseHTTPResponse") == "parse_http_response"
    assert to_kebab("ParseHttpResponse") == "parse-http-response"
    assert to_constant("parse-http-response") == "PARSE_HTTP_RESPONSE"
    assert to_pascal("parse_http_response") == "ParseHttpResponse"
    assert to_camel("PARSE_HTTP_RESPONSE") == "parseHttpResponse"


def test_round_trips_between_styles():
    for name in ["user_id", "max_retry_count", "html_to_pdf"]:
        assert to_snake(to_camel(name)) == name
        assert to_snake(to_kebab(name)) == name
        assert to_snake(to_constant(name)) == name


@pytest.mark.parametrize(
    ("identifier", "style"),
    [
        ("user_id", "snake"),
        ("user-id", "kebab"),
        ("USER_ID", "constant"),
        ("userId", "camel"),
        ("UserId", "pascal"),
        ("User_id", "mixed"),
    ],
)
def test_detect_case(identifier, style):
    assert detect_case(identifier) == style
