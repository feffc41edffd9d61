"""Privacy as data: mechanisms are dp_accounting events, charged to per-silo ledgers."""
