"""The generator's knobs, shared constants and argument checks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from silofl.errors import ConfigError
from silofl.pandemic.schema import ActivityType

#: Bump when the generator's output for a given (params, seed) changes.
GENERATOR_VERSION = "1.0"

_H = 3600  # seconds per hour

A_HOME, A_WORK, A_SHOP, A_OTHER, A_SCHOOL, A_COLLEGE, A_RELIGION = (int(a) for a in ActivityType)
# primary location kinds (index into LOCATION_FLAGS + "work-only")
K_WORK, K_SHOP, K_SCHOOL, K_OTHER, K_COLLEGE, K_RELIGION = range(6)


@dataclass(frozen=True)
class OutbreakParams:
    """Knobs of the generator.  Defaults are tuned to the challenge's statistics."""

    # households: P(size = 1..8); 6+ = 3% split 6/7/8
    household_size_probs: tuple[float, ...] = (0.28, 0.35, 0.15, 0.13, 0.06, 0.018, 0.008, 0.004)
    # locations per person (or per pupil/worker)
    persons_per_shop: float = 200.0
    persons_per_other: float = 150.0
    persons_per_religion: float = 500.0
    persons_per_college: float = 20_000.0
    pupils_per_school: float = 400.0
    workers_per_workplace: float = 18.0
    # activities
    shopping_prob: float = 0.5
    other_prob: float = 0.55
    religion_prob: float = 0.06
    college_prob: float = 0.4
    commute_cross_region: float = 0.08
    errand_cross_region: float = 0.04
    college_cross_region: float = 0.3
    # contact structure
    team_size_min: int = 4
    team_size_mean_extra: float = 9.0
    team_size_max: int = 20
    coworker_window: int = 6
    coworker_contact_prob: float = 0.5
    class_size: int = 22
    college_section_size: int = 30
    college_contact_prob: float = 0.35
    venue_window: int = 16
    venue_contact_prob: float = 0.55
    staff_contact_prob: float = 0.25
    front_desk_contact_prob: float = 0.8
    max_staff_met: int = 6
    max_venue_popularity: float = 100.0
    venue_popularity_shape: float = 1.0
    # disease
    beta_per_hour: float = 0.007
    infectious_days_min: int = 4
    infectious_days_max: int = 9
    asymptomatic_fraction: float = 0.35
    asymptomatic_infectivity: float = 0.5
    isolation_factor: float = 0.3
    initial_infected_fraction: float = 0.0008
    min_initial_infected: int = 5
    importation_rate: float = 4e-5
    min_importations_per_day: float = 0.25
    awareness: float = 600.0



def check_args(persons: int, regions: int, seed: int, days: int, horizon: int) -> None:
    """Refuse generator arguments outside what it supports (raises ConfigError)."""
    if not isinstance(persons, (int, np.integer)) or persons < 50:
        raise ConfigError(f"persons must be an integer >= 50, got {persons!r}")
    if persons > 50_000_000:
        raise ConfigError(f"persons={persons} is beyond what the generator supports (50M); use fewer")
    if not isinstance(regions, (int, np.integer)) or regions < 1:
        raise ConfigError(f"regions must be a positive integer, got {regions!r}")
    if regions * 40 > persons:
        raise ConfigError(f"regions={regions} is too many for {persons} persons; keep at least "
                          f"40 persons per region (regions <= {persons // 40})")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    if days < 1 or horizon < 1 or days + horizon > 365:
        raise ConfigError(f"need days >= 1, horizon >= 1 and days + horizon <= 365; got days={days}, "
                          f"horizon={horizon}")

