"""The pandemic forecasting inputs (US/UK PETs Prize Challenge, pandemic track) as data.

The challenge ships a synthetic population of Virginia as seven tables plus, for
evaluation, a target table.  This module declares those tables (core `TableSpec`s of
core `ColumnSpec`s): their file names, their columns and the compact in-memory dtype
each column is read into.  The
readers (:mod:`silofl.pandemic.readers`) and the generator
(:mod:`silofl.pandemic.synth`) both work from these specs, so they cannot drift.

Conventions (shared by the reader, the generator and downstream code):

* Identifiers (``pid``, ``hid``, ``rlid``, ``alid``, ``lid``) are integers.
  Residence-location ids (``rlid``) and activity-location ids (``alid``) live in
  one id space: a ``lid`` in the assignment or network table names either kind,
  so the two sets must not overlap.
* Activity types (``activity_type``, ``activity1``, ``activity2``) use the
  challenge codes of :class:`ActivityType`: 1 home, 2 work, 3 shopping, 4 other,
  5 school, 6 college, 7 religion.  For a home activity (type 1) the ``lid`` is
  the ``rlid`` of the person's residence.
* Health states are the letters ``S``, ``I``, ``R``; in memory they are int8
  codes 0 = S, 1 = I, 2 = R (:data:`STATE_CODES`).  Asymptomatic infections
  stay recorded as ``S``.
* Times (``start_time``, ``duration``) are seconds since midnight of a typical
  day; contacts repeat every day.
* ``sex`` is 1 (male) or 2 (female).
* Regions: a person's region is the ``county`` of the residence location of
  their home activity (``activity_type == 1``).  The real challenge partitions
  persons by the county of their residence; the synthetic data carries that
  county as an extra integer column ``county`` of the residence-location table
  (FIPS-like codes, e.g. 51001).  Without that column every region is unknown.
* Each row of the population network is one contact between ``pid1`` and
  ``pid2`` at location ``lid``; ``activity1``/``activity2`` are what each of the
  two was doing.  A pair can have several rows (e.g. household members meet in
  the morning and in the evening).
* The label: ``infected`` is 1 iff the person's recorded state goes from S to I
  on some day in ``TRAIN_DAYS .. TRAIN_DAYS + HORIZON - 1`` (57..63).
"""

from __future__ import annotations

from enum import IntEnum

from silofl.data.columnar import TableSpec
from silofl.data.schema import ColumnSpec

#: Days of recorded health states given for training (days 0..56).
TRAIN_DAYS = 57
#: Length of the prediction window (days 57..63).
HORIZON = 7
#: Seconds in the (repeating) day.
SECONDS_PER_DAY = 86_400

#: Health-state letters in code order, and the letter -> int8 code map.
STATE_LETTERS: tuple[str, ...] = ("S", "I", "R")
STATE_CODES: dict[str, int] = {s: i for i, s in enumerate(STATE_LETTERS)}
STATE_S, STATE_I, STATE_R = 0, 1, 2


class ActivityType(IntEnum):
    """Challenge activity codes (``activity_type``, ``activity1``, ``activity2``)."""

    HOME = 1
    WORK = 2
    SHOPPING = 3
    OTHER = 4
    SCHOOL = 5
    COLLEGE = 6
    RELIGION = 7


#: Valid activity codes.
ACTIVITY_CODES: tuple[int, ...] = tuple(int(a) for a in ActivityType)

#: Type flags of an activity location, in file column order.
LOCATION_FLAGS: tuple[str, ...] = ("work", "shopping", "school", "other", "college", "religion")

def _c(name: str, dtype: str, kind: str = "int", description: str = "") -> ColumnSpec:
    levels = STATE_LETTERS if kind == "state" else ()
    return ColumnSpec(name, kind, levels=levels, description=description, dtype=dtype)


PERSONS = TableSpec(
    key="persons",
    stem="va_person",
    columns=(
        _c("pid", "int32", "id", "person id (unique)"),
        _c("hid", "int32", "id", "household id"),
        _c("person_number", "int16", "int", "1-based position within the household"),
        _c("age", "uint8", "int", "age in years (0..130)"),
        _c("sex", "int8", "int", "1 = male, 2 = female"),
    ),
    description="One row per person.",
    unique_key="pid",
)

HOUSEHOLDS = TableSpec(
    key="households",
    stem="va_household",
    columns=(
        _c("hid", "int32", "id", "household id (unique)"),
        _c("hh_size", "int16", "int", "number of persons in the household"),
    ),
    description="One row per household; other census columns may follow and are ignored.",
    unique_key="hid",
)

RESIDENCE_LOCATIONS = TableSpec(
    key="residence_locations",
    stem="va_residence_locations",
    columns=(
        _c("rlid", "int32", "id", "residence location id (unique; disjoint from alid)"),
        _c("longitude", "float32", "float"),
        _c("latitude", "float32", "float"),
    ),
    optional=(_c("county", "int32", "int", "county code used to partition persons into regions"),),
    description="Homes. The optional `county` column defines the regions.",
    unique_key="rlid",
)

ACTIVITY_LOCATIONS = TableSpec(
    key="activity_locations",
    stem="va_activity_locations",
    columns=(
        _c("alid", "int32", "id", "activity location id (unique; disjoint from rlid)"),
        _c("longitude", "float32", "float"),
        _c("latitude", "float32", "float"),
    )
    + tuple(_c(f, "uint8", "flag", f"1 if the location hosts {f} activities") for f in LOCATION_FLAGS),
    description="Workplaces, shops, schools and other places people visit.",
    unique_key="alid",
)

ACTIVITY_LOCATION_ASSIGNMENT = TableSpec(
    key="activity_location_assignment",
    stem="va_activity_location_assignment",
    columns=(
        _c("pid", "int32", "id"),
        _c("activity_number", "int16", "int", "order of the activity within the person's day"),
        _c("activity_type", "int8", "int", "ActivityType code 1..7"),
        _c("start_time", "int32", "int", "seconds since midnight"),
        _c("duration", "int32", "int", "seconds"),
        _c("lid", "int32", "id", "rlid for home activities, alid otherwise"),
    ),
    description="Each person's daily schedule: where they are and when.",
)

POPULATION_NETWORK = TableSpec(
    key="population_network",
    stem="va_population_network",
    columns=(
        _c("pid1", "int32", "id"),
        _c("pid2", "int32", "id"),
        _c("lid", "int32", "id", "where the contact happens"),
        _c("start_time", "int32", "int", "seconds since midnight"),
        _c("duration", "int32", "int", "seconds"),
        _c("activity1", "int8", "int", "ActivityType of pid1 during the contact"),
        _c("activity2", "int8", "int", "ActivityType of pid2 during the contact"),
    ),
    description="Contacts; the same contacts repeat every day.",
)

DISEASE_OUTCOME_TRAINING = TableSpec(
    key="disease_outcome_training",
    stem="va_disease_outcome_training",
    columns=(
        _c("day", "int16", "int", "0 .. TRAIN_DAYS-1"),
        _c("pid", "int32", "id"),
        _c("state", "int8", "state", "S, I or R"),
    ),
    description="Recorded health state of every person on every training day.",
)

DISEASE_OUTCOME_TARGET = TableSpec(
    key="disease_outcome_target",
    stem="va_disease_outcome_target",
    columns=(
        _c("pid", "int32", "id"),
        _c("infected", "int8", "int", "1 iff S -> I on some day in the horizon"),
    ),
    description="Ground truth: infection in days TRAIN_DAYS .. TRAIN_DAYS+HORIZON-1.",
    unique_key="pid",
)

#: The seven challenge inputs, keyed by table key, in the challenge's order.
TABLES: dict[str, TableSpec] = {
    t.key: t
    for t in (
        PERSONS,
        HOUSEHOLDS,
        RESIDENCE_LOCATIONS,
        ACTIVITY_LOCATIONS,
        ACTIVITY_LOCATION_ASSIGNMENT,
        POPULATION_NETWORK,
        DISEASE_OUTCOME_TRAINING,
    )
}
#: The ground-truth table (not one of the inputs).
TARGET: TableSpec = DISEASE_OUTCOME_TARGET
#: Inputs plus target.
ALL_TABLES: dict[str, TableSpec] = {**TABLES, TARGET.key: TARGET}

#: Name of the generator's manifest inside a dataset directory.
MANIFEST_NAME = "manifest.json"


def expected_filenames(with_target: bool = False) -> list[str]:
    """The file stems the reader expects (each as .csv, .csv.gz or .parquet)."""
    specs = list(TABLES.values()) + ([TARGET] if with_target else [])
    return [s.stem + ".csv" for s in specs]


def all_dataset_filenames() -> set[str]:
    """Every file name a dataset directory written by the generator may contain."""
    names = {MANIFEST_NAME}
    for spec in ALL_TABLES.values():
        names.update(spec.filenames())
    return names
