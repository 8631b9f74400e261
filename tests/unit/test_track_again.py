"""When a tracked run is measured again (``every=`` / ``at=``), and how its later records stay their own."""

from __future__ import annotations

import pytest

from ckptbench.report.columns import _variant
from ckptbench.store.records import latest_per_case, record_key
from ckptbench.track.again import Again
from ckptbench.track.out import TrackSetupError


def test_the_next_measurement_is_the_first_requested_step_not_yet_covered():
    assert not Again() and Again(every=5) and Again(at=[3])
    assert Again().after(7) is None
    periodic = Again(every=10)
    assert [periodic.after(k) for k in (1, 6, 10, 11, 20)] == [10, 10, 10, 20, 20]
    named = Again(at=[50, 8, 8])  # sorted, once each
    assert named.at == [8, 50] and [named.after(k) for k in (6, 8, 9, 51)] == [8, 8, 50, None]
    both = Again(every=100, at=[30])
    assert [both.after(k) for k in (6, 31, 101)] == [30, 100, 200]


@pytest.mark.parametrize("kwargs, key", [({"every": 0}, "every"), ({"every": -3}, "every"), ({"every": 2.5}, "every"),
                                         ({"every": True}, "every"), ({"at": [4, "9"]}, "at"), ({"at": [0]}, "at")])
def test_a_bad_request_is_refused_in_one_line_naming_its_key(kwargs, key):
    with pytest.raises(TrackSetupError) as caught:
        Again(**kwargs)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"ckptbench.track: {key}: ")


def test_a_later_measurement_is_a_record_of_its_own_named_by_its_step():
    first = {"case_id": "c", "repeat": 0, "track": {"rank": 0, "from_step": 0}}
    later = {"case_id": "c", "repeat": 0, "track": {"rank": 0, "from_step": 12}}
    other_rank = {"case_id": "c", "repeat": 0, "track": {"rank": 1, "from_step": 12}}
    assert record_key(first) == ("c", 0) and record_key({"case_id": "c"}) == ("c", 0)  # as before
    assert record_key(later) == ("c", 0, ("from", 12)) and record_key(other_rank) == ("c", 0, 1, ("from", 12))
    assert len(latest_per_case([first, later, other_rank])) == 3  # none merged as a repeat of another
    assert _variant("llama", "fp32", "sdpa", "off", "manual", 1, 0, 1, 0, 12).endswith(" · from step 12")
    assert "from step" not in _variant("llama", "fp32", "sdpa", "off", "manual", 1, 0, 1, 0, 0)
