"""The narrowing points the runtime's type annotations rest on: each names the bad case
with a specific error instead of failing later on a None or a stray string."""

import numpy as np
import pytest

from silofl.algorithms import make_algorithm
from silofl.errors import ConfigError, PrivacyError
from silofl.privacy.budget import BudgetStore
from silofl.privacy.targets import PrivacyTarget
from silofl.runtime.job import accountant_kind, open_job
from silofl.runtime.network.hosting import local_dp_family, merge_updates
from silofl.runtime.plan import SiloPlan, job_targets


def test_accountant_kind_keeps_known_names_and_refuses_others():
    assert accountant_kind("rdp") == "rdp"
    assert accountant_kind("pld") == "pld"
    with pytest.raises(PrivacyError, match="unknown accountant 'prv'"):
        accountant_kind("prv")


def test_open_job_refuses_an_unknown_accountant_before_reserving():
    store = BudgetStore(None)
    target = PrivacyTarget(1.0, 1e-5)
    plan = SiloPlan("A", 100, 0.1, 10, target, 1.0, declared=None)
    with pytest.raises(PrivacyError, match="unknown accountant"):
        open_job(store, {"fedavg": [plan]}, lifetime={"A": target}, command="test",
                 noise="seeded", accountant="prv")
    assert store.silos() == []  # the store was not touched: nothing registered or reserved


def test_job_targets_refuses_a_plan_without_target():
    t = PrivacyTarget(2.0, 1e-5)
    ok = [SiloPlan("A", 10, 0.1, 1, t), SiloPlan("B", 10, 0.1, 1, t)]
    assert job_targets(ok) == {"A": t, "B": t}
    with pytest.raises(PrivacyError, match="'B'.*no privacy target"):
        job_targets([ok[0], SiloPlan("B", 10, 0.1, 1, None)])


def test_merge_updates_with_no_answer():
    # the averaging methods merge nothing; the others name the round that cannot go on
    update, w = merge_updates(make_algorithm("fedavg"), {}, {}, 2, 3)
    assert update is None and w.shape == (0,)
    with pytest.raises(ConfigError, match="no silo answered round 3"):
        merge_updates(make_algorithm("ifca"), {}, {}, 2, 3)


def test_local_dp_family_guard():
    assert local_dp_family(make_algorithm("privatekt"))
    assert local_dp_family(make_algorithm("fedavg_ldp"))
    assert not local_dp_family(make_algorithm("fedavg"))
    kt = make_algorithm("fedavg_ldp")
    assert local_dp_family(kt)
    assert kt.upload_event() is not None
    assert np.asarray(kt.select_clients(np.ones(3, bool), 1)).ndim == 1
