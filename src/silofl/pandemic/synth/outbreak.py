"""``generate_outbreak``: the generator's steps in order, the in-memory result and its statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from silofl.data.ids import first_occurrence, sorted_unique, stable_argsort
from silofl.pandemic.schema import HORIZON, LOCATION_FLAGS, TARGET, TRAIN_DAYS
from silofl.pandemic.synth.activities import Locations, assign_roles, make_locations
from silofl.pandemic.synth.contacts import make_contacts
from silofl.pandemic.synth.disease import NEVER, simulate, states_matrix
from silofl.pandemic.synth.params import A_HOME, OutbreakParams, check_args
from silofl.pandemic.synth.population import (
    Geography,
    Households,
    Persons,
    make_households,
    make_persons,
    place_regions,
)
from silofl.pandemic.synth.schedules import assignment_table, make_schedule


@dataclass
class SyntheticOutbreak:
    """A generated dataset in memory (arrays; ``tables`` use the file column names).

    ``tables[key]`` maps column name to a NumPy array for every table of
    :data:`silofl.pandemic.schema.ALL_TABLES` except the network and outcomes,
    which are kept compact: ``network`` holds person *indices* (``src``/``dst``)
    and ``states`` the recorded (P, days + horizon) int8 matrix (0 S, 1 I, 2 R).
    Persons are sorted by pid; ``pids[i]`` is person ``i``'s id.
    """

    persons: int
    regions: int
    seed: int
    days: int
    horizon: int
    params: OutbreakParams
    pids: np.ndarray
    tables: dict[str, dict[str, np.ndarray]]
    network: dict[str, np.ndarray]
    states: np.ndarray
    target: np.ndarray
    infection_day: np.ndarray  # (P,) int16 first infectious day, or -32768 if never (days < 0 for seeds)
    asymptomatic: np.ndarray  # (P,) bool
    region: np.ndarray  # (P,) int16 region index of each person
    stats: dict = field(default_factory=dict)

    def to_pandemic_data(self):
        """The same content as ``read_dataset`` would return for the written files."""
        return _to_pandemic_data(self)


def generate_outbreak(*, persons: int = 10_000, regions: int = 5, seed: int = 0, days: int = TRAIN_DAYS,
                      horizon: int = HORIZON, params: OutbreakParams | None = None) -> SyntheticOutbreak:
    """Generate a synthetic population, contact network and outbreak in memory.

    Parameters
    ----------
    persons, regions : int
        Population size (>= 50) and number of regions (counties, <= persons / 40).
    seed : int
        Non-negative seed; the same arguments give bit-identical arrays.
    days, horizon : int
        Training days and label days after them (days + horizon <= 365).
    params : OutbreakParams, optional
        The generator's knobs; defaults are tuned to the challenge's statistics.

    Returns
    -------
    SyntheticOutbreak
        The tables, the contact network and the (persons, days + horizon) recorded states.
    """
    check_args(persons, regions, seed, days, horizon)
    prm = params or OutbreakParams()
    N, R = int(persons), int(regions)
    # one independent stream per step, so each step's draws do not depend on another's
    streams = np.random.SeedSequence([int(seed), 0x5F1A_0FA1]).spawn(8)
    rng_geo, rng_hh, rng_pp, rng_loc, rng_sched, rng_net, rng_sir, _ = (
        np.random.default_rng(s) for s in streams)

    geo = place_regions(rng_geo, R)
    hh = make_households(rng_hh, N, R, geo, prm)
    ppl = make_persons(rng_pp, N, hh)
    roles = assign_roles(rng_sched, ppl.age, prm)
    locs = make_locations(rng_loc, ppl.region, roles, R, hh.count, geo, prm)
    home_lid = hh.rlids[ppl.hh_of].astype(np.int64)
    sched = make_schedule(rng_sched, ppl.region, ppl.age, home_lid, roles, locs, geo.weights, R, prm)
    assignment = assignment_table(sched, ppl.pids, locs.alids)
    network = make_contacts(rng_net, ppl.hh_of, ppl.age, sched, locs, prm)
    # free the schedule before the outbreak simulation (matters at millions of persons)
    del sched, roles, home_lid

    T = days + horizon
    inf_day, inf_end, asym = simulate(network, ppl.age, ppl.region, N, T, prm, rng_sir)
    states = states_matrix(inf_day, inf_end, asym, T)
    del inf_end
    onset = inf_day.astype(np.int64)
    target = ((~asym) & (onset >= days) & (onset < T)).astype(np.int8)
    out = SyntheticOutbreak(
        persons=N, regions=R, seed=int(seed), days=days, horizon=horizon, params=prm, pids=ppl.pids,
        tables=_tables(geo, hh, ppl, locs, assignment, target), network=network, states=states, target=target,
        infection_day=np.where(inf_day == NEVER, np.iinfo(np.int16).min, inf_day).astype(np.int16),
        asymptomatic=asym, region=ppl.region,
    )
    out.stats = _stats(out)
    return out


def _tables(geo: Geography, hh: Households, ppl: Persons, locs: Locations, assignment: dict[str, np.ndarray],
            target: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """The challenge tables (file column names) other than the network and outcomes."""
    hh_order = stable_argsort(hh.rlids)
    pids = ppl.pids
    return {
        "persons": {"pid": pids, "hid": hh.hids[ppl.hh_of], "person_number": ppl.pnum, "age": ppl.age,
                    "sex": ppl.sex},
        "households": {"hid": hh.hids, "hh_size": hh.sizes.astype(np.int16), "hh_vehicles": hh.vehicles},
        "residence_locations": {"rlid": hh.rlids[hh_order], "longitude": hh.lon[hh_order],
                                "latitude": hh.lat[hh_order],
                                "county": geo.county_codes[hh.region[hh_order]]},
        "activity_locations": {"alid": locs.alids, "longitude": locs.lon, "latitude": locs.lat,
                               **{f: locs.flags[:, j].copy() for j, f in enumerate(LOCATION_FLAGS)}},
        "activity_location_assignment": assignment,
        TARGET.key: {"pid": pids, "infected": target},
    }


def _distinct_degree(src: np.ndarray, dst: np.ndarray, n: int, step: int = 1 << 24) -> np.ndarray:
    """Number of distinct contacts of each person (~10 bytes per contact row at the peak)."""
    key = np.minimum(src, dst).astype(np.int64)
    key *= n
    key += np.maximum(src, dst)
    key.sort()
    deg = np.zeros(n, np.int64)
    for lo in range(0, key.size, step):
        k = key[lo:lo + step + 1]
        first = np.ones(k.size, bool)
        if lo:
            first[0] = False  # k[0] belongs to the previous block
        np.not_equal(k[1:], k[:-1], out=first[1:])
        u = k[first]
        deg += np.bincount(u // n, minlength=n)
        deg += np.bincount(u % n, minlength=n)
    return deg


def _stats(o: SyntheticOutbreak) -> dict:
    N, T, days = o.persons, o.days + o.horizon, o.days
    net = o.network
    deg = _distinct_degree(net["src"], net["dst"], N)
    inf = o.infection_day.astype(np.int64)
    never = inf == np.iinfo(np.int16).min
    ever_true = (~never) & (inf < T)
    ever_rec = ever_true & ~o.asymptomatic
    cross = o.region[net["src"]] != o.region[net["dst"]]
    region_sizes = np.bincount(o.region, minlength=o.regions)
    return {
        "persons": N,
        "households": int(o.tables["households"]["hid"].size),
        "activity_locations": int(o.tables["activity_locations"]["alid"].size),
        "assignments": int(o.tables["activity_location_assignment"]["pid"].size),
        "contacts": int(net["src"].size),
        "mean_contacts_per_person": round(float(deg.mean()), 4),
        "max_contacts_per_person": int(deg.max()) if N else 0,
        "cross_region_contact_fraction": round(float(cross.mean()) if cross.size else 0.0, 6),
        "region_sizes": [int(x) for x in region_sizes],
        "ever_infected_fraction": round(float(ever_true.mean()), 6),
        "ever_infected_recorded_fraction": round(float(ever_rec.mean()), 6),
        "infected_by_train_end_recorded_fraction": round(float((ever_rec & (inf < days)).mean()), 6),
        "final_window_new_infection_fraction": round(float(o.target.mean()), 6),
        "final_window_new_infections": int(o.target.sum()),
    }


def _to_pandemic_data(o: SyntheticOutbreak):
    import pandas as pd

    from silofl.data.ids import IdIndex
    from silofl.pandemic.dataset import ContactNetwork, PandemicData

    t = o.tables
    pid_index = IdIndex(o.pids)
    hh = t["households"]
    hid_index = IdIndex(hh["hid"])
    hidx = hid_index.lookup(t["persons"]["hid"])
    rl = t["residence_locations"]
    al = t["activity_locations"]
    asg = t["activity_location_assignment"]
    person = pid_index.lookup(asg["pid"])
    home = asg["activity_type"] == A_HOME
    home_lid = np.full(o.persons, -1, np.int32)
    u, f = first_occurrence(person[home])
    home_lid[u] = asg["lid"][home][f]
    county = rl["county"][IdIndex(rl["rlid"]).lookup(home_lid)]
    region_codes = sorted_unique(county).astype(np.int32)
    region = np.searchsorted(region_codes, county).astype(np.int16)
    net = o.network
    return PandemicData(
        pids=o.pids,
        pid_index=pid_index,
        hid=t["persons"]["hid"],
        person_number=t["persons"]["person_number"],
        age=t["persons"]["age"],
        sex=t["persons"]["sex"],
        hh_size=hh["hh_size"][hidx],
        home_lid=home_lid,
        county=county.astype(np.int32),
        region=region,
        region_codes=region_codes,
        households=pd.DataFrame({"hid": hh["hid"], "hh_size": hh["hh_size"]}),
        residence_locations=pd.DataFrame({"rlid": rl["rlid"], "longitude": rl["longitude"].astype(np.float32),
                                          "latitude": rl["latitude"].astype(np.float32),
                                          "county": rl["county"].astype(np.int32)}),
        activity_locations=pd.DataFrame({"alid": al["alid"], "longitude": al["longitude"].astype(np.float32),
                                         "latitude": al["latitude"].astype(np.float32),
                                         **{fl: al[fl] for fl in LOCATION_FLAGS}}),
        assignment=pd.DataFrame({"person": person, **{c: asg[c] for c in
                                                      ("activity_number", "activity_type", "start_time",
                                                       "duration", "lid")}}),
        network=ContactNetwork(src=net["src"], dst=net["dst"], lid=net["lid"],
                               start_time=net["start_time"], duration=net["duration"],
                               activity1=net["activity1"], activity2=net["activity2"]),
        states=np.ascontiguousarray(o.states[:, :o.days]),
        target=o.target,
        directory=None,
    )


# =========================================================================== #
