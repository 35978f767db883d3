"""The fixture the modules of tests/unit/fuzz/ share: `regions`, a SharedMemoryManager with the
client region "fuzz" (fuzz_helpers.client_region), one for each module."""

import pytest

from tests.unit.fuzz.fuzz_helpers import client_region


@pytest.fixture(scope="module")
def regions():
    with client_region() as manager:
        yield manager
