"""Pandemic forecasting (PETs challenge): table schema, readers and a synthetic outbreak generator."""

from silofl.data.ids import IdIndex
from silofl.pandemic.dataset import ContactNetwork, PandemicData
from silofl.pandemic.readers import find_table_file, read_dataset, read_table
from silofl.pandemic.schema import (
    ALL_TABLES,
    HORIZON,
    LOCATION_FLAGS,
    STATE_CODES,
    STATE_LETTERS,
    TABLES,
    TARGET,
    TRAIN_DAYS,
    ActivityType,
    ColumnSpec,
    TableSpec,
    expected_filenames,
)
from silofl.pandemic.synth import (
    GENERATOR_VERSION,
    OutbreakParams,
    SyntheticOutbreak,
    generate_outbreak,
    synthesize,
    write_outbreak,
)

__all__ = [
    "ALL_TABLES",
    "ActivityType",
    "ColumnSpec",
    "ContactNetwork",
    "GENERATOR_VERSION",
    "HORIZON",
    "IdIndex",
    "LOCATION_FLAGS",
    "OutbreakParams",
    "PandemicData",
    "STATE_CODES",
    "STATE_LETTERS",
    "SyntheticOutbreak",
    "TABLES",
    "TARGET",
    "TRAIN_DAYS",
    "TableSpec",
    "expected_filenames",
    "find_table_file",
    "generate_outbreak",
    "read_dataset",
    "read_table",
    "synthesize",
    "write_outbreak",
]
