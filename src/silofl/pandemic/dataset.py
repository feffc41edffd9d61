"""The pandemic challenge dataset in memory: the contact network and `PandemicData`
(what `pandemic.readers.read_dataset` returns and `pandemic.synth` builds)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd

from silofl.data.ids import IdIndex, stable_argsort
from silofl.pandemic.schema import LOCATION_FLAGS, ActivityType

__all__ = ["ContactNetwork", "PandemicData"]


@dataclass
class ContactNetwork:
    """The contact table as parallel arrays, one entry per file row.

    ``src``/``dst`` are *person indices* (rows of the per-person arrays) of
    ``pid1``/``pid2``; ``lid`` is the raw location id (look it up with
    ``PandemicData.lid_index``); times are seconds; activities are
    :class:`~silofl.pandemic.schema.ActivityType` codes.  Contacts are
    undirected and repeat every day; a pair may appear in several rows.
    """

    src: np.ndarray  # (E,) int32
    dst: np.ndarray  # (E,) int32
    lid: np.ndarray  # (E,) int32 (int64 only if location ids exceed int32)
    start_time: np.ndarray  # (E,) int32
    duration: np.ndarray  # (E,) int32
    activity1: np.ndarray  # (E,) int8
    activity2: np.ndarray  # (E,) int8

    def __len__(self) -> int:
        return int(self.src.size)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, f).nbytes for f in self.__dataclass_fields__)

    def degree(self, num_persons: int) -> np.ndarray:
        """Contact rows touching each person (int64, length ``num_persons``)."""
        return np.bincount(self.src, minlength=num_persons) + np.bincount(self.dst, minlength=num_persons)


@dataclass
class PandemicData:
    """A challenge dataset in memory.  ``P`` persons, ``D`` days, ``E`` contacts.

    Per-person arrays (length ``P``, row ``i`` = person index ``i``, persons
    sorted by pid):

    ============== ======= =====================================================
    pids           int32   person id (int64 only if ids exceed int32)
    hid            int32   household id
    person_number  int16   position in household
    age            uint8   years
    sex            int8    1 male, 2 female
    hh_size        int16   size of the person's household (from households)
    home_lid       int32   rlid of the person's home activity (-1 if none)
    county         int32   county of that residence (-1 if unknown)
    region         int16   index into ``region_codes`` (-1 if unknown)
    ============== ======= =====================================================

    ``states``: (P, D) int8, codes 0 = S, 1 = I, 2 = R.  ``target``: (P,) int8
    labels (only when read with ``with_target=True``).  ``network``: a
    :class:`ContactNetwork`.  Tables: ``households`` (hid, hh_size),
    ``residence_locations`` (rlid, longitude, latitude, county),
    ``activity_locations`` (alid, longitude, latitude, six uint8 flags),
    ``assignment`` (person [index], activity_number, activity_type,
    start_time, duration, lid), each sorted by its id (assignment in file
    order).  ``pid_index`` / ``lid_index`` map ids to positions (``lid_index``
    positions are rows of :meth:`location_table`).
    """

    pids: np.ndarray
    pid_index: IdIndex
    hid: np.ndarray
    person_number: np.ndarray
    age: np.ndarray
    sex: np.ndarray
    hh_size: np.ndarray
    home_lid: np.ndarray
    county: np.ndarray
    region: np.ndarray
    region_codes: np.ndarray
    households: pd.DataFrame
    residence_locations: pd.DataFrame
    activity_locations: pd.DataFrame
    assignment: pd.DataFrame
    network: ContactNetwork
    states: np.ndarray
    target: np.ndarray | None = None
    directory: Path | None = None
    lid_index: IdIndex = field(default=None, repr=False)  # type: ignore[assignment]

    def __post_init__(self):
        if self.lid_index is None:
            lids = np.concatenate(
                [self.residence_locations["rlid"].to_numpy(), self.activity_locations["alid"].to_numpy()]
            )
            self.lid_index = IdIndex(np.sort(lids))

    # -- sizes --------------------------------------------------------------
    @property
    def num_persons(self) -> int:
        return int(self.pids.size)

    @property
    def num_days(self) -> int:
        return int(self.states.shape[1])

    @property
    def num_contacts(self) -> int:
        return len(self.network)

    @property
    def num_regions(self) -> int:
        return int(self.region_codes.size)

    # -- views ----------------------------------------------------------------
    @property
    def persons(self) -> pd.DataFrame:
        """Per-person attributes as a DataFrame (row i = person index i)."""
        return pd.DataFrame(
            {
                "pid": self.pids,
                "hid": self.hid,
                "person_number": self.person_number,
                "age": self.age,
                "sex": self.sex,
                "hh_size": self.hh_size,
                "home_lid": self.home_lid,
                "county": self.county,
                "region": self.region,
            },
            copy=False,
        )

    def region_members(self, region: int) -> np.ndarray:
        """Person indices (int64, ascending) whose ``region`` index equals ``region``."""
        return np.flatnonzero(self.region == region)

    @cached_property
    def _location_table(self) -> pd.DataFrame:
        rl, al = self.residence_locations, self.activity_locations
        lid = np.concatenate([rl["rlid"].to_numpy(), al["alid"].to_numpy()])
        order = stable_argsort(lid)
        n_rl = len(rl)
        cols: dict[str, np.ndarray] = {
            "lid": lid[order],
            "longitude": np.concatenate([rl["longitude"].to_numpy(), al["longitude"].to_numpy()])[order],
            "latitude": np.concatenate([rl["latitude"].to_numpy(), al["latitude"].to_numpy()])[order],
            "residence": (order < n_rl).astype(np.uint8),
        }
        for f in LOCATION_FLAGS:
            cols[f] = np.concatenate([np.zeros(n_rl, np.uint8), al[f].to_numpy()])[order]
        cols["county"] = np.concatenate([rl["county"].to_numpy(), np.full(len(al), -1, np.int32)])[order]
        return pd.DataFrame(cols, copy=False)

    def location_table(self) -> pd.DataFrame:
        """Residence and activity locations in one table sorted by ``lid``.

        Row ``k`` describes ``lid_index.ids[k]``; columns: lid, longitude,
        latitude (float32), residence (uint8), the six activity flags (uint8,
        0 for residences) and county (-1 for activity locations).
        """
        return self._location_table

    #: activity types reported by :meth:`activity_indicators`, in column order
    ACTIVITY_NAMES: ClassVar[tuple[str, ...]] = ("work", "shopping", "other", "school", "college", "religion")

    def activity_indicators(self) -> np.ndarray:
        """(P, 6) uint8: 1 if the person's schedule has a work, shopping, other, school,
        college or religion activity (columns in :attr:`ACTIVITY_NAMES` order)."""
        a = self.assignment
        t = a["activity_type"].to_numpy()
        p = a["person"].to_numpy()
        out = np.zeros((self.num_persons, 6), np.uint8)
        for j, code in enumerate((ActivityType.WORK, ActivityType.SHOPPING, ActivityType.OTHER,
                                  ActivityType.SCHOOL, ActivityType.COLLEGE, ActivityType.RELIGION)):
            out[p[t == int(code)], j] = 1
        return out

    def frac_out_of_home(self) -> np.ndarray:
        """(P,) float32: share of the day spent in non-home activities, clipped to [0, 1]."""
        a = self.assignment
        away = a["activity_type"].to_numpy() != int(ActivityType.HOME)
        secs = np.bincount(a["person"].to_numpy()[away], weights=a["duration"].to_numpy()[away],
                           minlength=self.num_persons)
        return np.clip(secs / 86_400.0, 0.0, 1.0).astype(np.float32)

    def feature_inputs(self, persons: np.ndarray | None = None) -> dict:
        """Keyword arguments for ``silofl.pandemic.features.build_neighbourhood_features``.

        With ``persons`` (person indices, e.g. ``region_members(r)``) everything is
        restricted to that subset, re-indexed ``0..len(persons)-1`` in the given order,
        and only contacts with both ends inside are kept (a silo's local subgraph).
        Location arrays always cover all locations (``location_ids`` = lid).
        """
        net = self.network
        P = self.num_persons
        if persons is None:
            sel = None
            src, dst = net.src, net.dst
            keep = slice(None)
        else:
            sel = np.asarray(persons, dtype=np.int64)
            remap = np.full(P, -1, np.int32)
            remap[sel] = np.arange(sel.size, dtype=np.int32)
            s, d = remap[net.src], remap[net.dst]
            keep = (s >= 0) & (d >= 0)
            src, dst = s[keep], d[keep]
        loc = self.location_table()
        pick = (lambda x: x) if sel is None else (lambda x: x[sel])
        return dict(
            src=src, dst=dst, num_nodes=P if sel is None else int(sel.size),
            start_time=net.start_time[keep], duration=net.duration[keep], lid=net.lid[keep],
            age=pick(self.age), sex=pick(self.sex), household_size=pick(self.hh_size),
            activities=pick(self.activity_indicators()), frac_out_of_home=pick(self.frac_out_of_home()),
            states=pick(self.states),
            location_ids=loc["lid"].to_numpy(),
            location_flags=loc[list(LOCATION_FLAGS)].to_numpy(),
            longitude=loc["longitude"].to_numpy(), latitude=loc["latitude"].to_numpy(),
            activity_names=self.ACTIVITY_NAMES, location_flag_names=LOCATION_FLAGS,
        )

    def summary(self) -> dict:
        ever = (self.states != 0).any(axis=1)
        out = {
            "persons": self.num_persons,
            "days": self.num_days,
            "contacts": self.num_contacts,
            "households": len(self.households),
            "residence_locations": len(self.residence_locations),
            "activity_locations": len(self.activity_locations),
            "assignments": len(self.assignment),
            "regions": self.num_regions,
            "ever_infected_recorded": float(ever.mean()) if self.num_persons else 0.0,
        }
        if self.target is not None:
            out["target_rate"] = float(self.target.mean()) if self.num_persons else 0.0
        return out


