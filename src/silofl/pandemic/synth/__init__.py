"""Synthetic pandemic outbreaks in the exact schema of the PETs challenge.

``synthesize(out_dir, persons=..., regions=..., seed=...)`` writes the seven
challenge inputs (days 0..56) plus ``va_disease_outcome_target.csv`` (labels for
days 57..63) and a ``manifest.json``; ``generate_outbreak(...)`` returns the
same tables in memory.  Everything is vectorized NumPy and deterministic in
the seed: the same arguments give byte-identical files.

The model, in order:

1. **Regions** (counties): ``regions`` spatial clusters laid out on a jittered
   grid over Virginia's bounding box, with log-normal population shares (sizes
   differ by up to ~10x), FIPS-like county codes 51001, 51003, ...
2. **Households** with US sizes (1: 28%, 2: 35%, 3: 15%, 4: 13%, 5: 6%,
   6+: 3%), one residence location each, placed around their county's centre.
3. **Persons** with household-aware ages (householder, partner, children or
   other adults) and sex (1 male, 2 female).
4. **Activity locations** per county: workplaces (heavy-tailed sizes), shops,
   other venues, schools, colleges and places of worship, each with the six
   type flags; service venues also employ staff (``work`` = 1).
5. **Daily schedules**: morning home, then work (employed adults), school
   (ages 5-17) or college (some 18-22 year olds), then errands (shopping,
   other, religion) and evening home.  Most destinations lie in the home
   county; commuters, students and a few shoppers cross counties.
6. **Contacts** from co-location with overlapping time windows: household
   members at home (morning and evening rows), work teams (4-20) plus a few
   co-workers, school classes (~22, by age, plus a teacher), college sections,
   and at venues each visit meets some of the visits overlapping it and, often,
   the on-shift staff (most often the venue's "front desk" employee).  Group
   caps keep the graph sparse (mean ~21-25 distinct contacts per person, ~13
   contact rows per person); staff of busy venues form the heavy degree tail
   (max degree > 4x the mean even at a few thousand persons).  ~6% of contacts
   cross regions (commuters, students, shoppers).  Each contact is one row
   and repeats every day.
7. **Outbreak**: discrete-time SIR over days 0..days+horizon-1.  Seeds on day
   0 plus a trickle of imported cases; each day an infectious person infects
   each susceptible contact with probability
   ``1 - exp(-beta * hours * susceptibility(age) * infectivity * awareness)``
   where susceptibility grows with age, asymptomatic cases (35%, recorded as S
   throughout) transmit at half strength, symptomatic cases cut
   non-household contacts after their first day, and ``awareness =
   1 / (1 + k * recorded prevalence in the susceptible's region)`` (people
   avoid contacts when cases are visible), which holds the epidemic near a
   slow plateau.  Infectious periods last 4-9 days.  Defaults give ~3-4% of
   persons ever infected by day 63 (~2-2.7% recorded) and ~0.25-0.3% newly
   infected (recorded S -> I) in days 57..63, the label; at a few thousand
   persons the label rate varies more between seeds (~0.05-0.5%).

Scale (2-core machine, measured): 1M persons generate in ~9-15 s (13.5M
contact rows, ~1.4 GB peak RSS; writing CSV adds ~20 s); 7.7M persons (103M
contact rows, 439M outcome rows, 10 GB of CSV) generate in ~2.5 min with a
7.7 GB peak.

Modules, one per step: :mod:`.params` (knobs), :mod:`.population` (1-3),
:mod:`.activities` (4), :mod:`.schedules` (5), :mod:`.contacts`
(6), :mod:`.disease` (7), :mod:`.outbreak` (``generate_outbreak``) and
:mod:`.files` (``synthesize``, ``write_outbreak``).  Each step draws from its own
random stream in a fixed order; reordering draws changes every seeded dataset.
"""

from silofl.pandemic.synth.files import synthesize, write_outbreak
from silofl.pandemic.synth.outbreak import SyntheticOutbreak, generate_outbreak
from silofl.pandemic.synth.params import GENERATOR_VERSION, OutbreakParams

__all__ = [
           "GENERATOR_VERSION",
           "OutbreakParams",
           "SyntheticOutbreak",
           "generate_outbreak",
           "synthesize",
           "write_outbreak",
]
