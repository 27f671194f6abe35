from zoneinfo import ZoneInfo

import pytest

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
UTC = ZoneInfo("UTC")


@pytest.fixture
def berlin() -> ZoneInfo:
    return BERLIN


@pytest.fixture
def new_york() -> ZoneInfo:
    return NEW_YORK
