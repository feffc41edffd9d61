"""Empirical privacy auditing: does a silo's claimed ε survive an attack?
(`silofl audit`; see README, "Auditing a guarantee".) The pandemic track's node-level
audit is a domain audit over this engine: `silofl.pandemic.audit`."""

from silofl.audit.bounds import (fdp_rejects, multi_run_epsilon, one_run_audit,
                                 one_run_epsilon, one_run_gdp, one_run_p_value)
from silofl.audit.canaries import Canaries, make_canaries
from silofl.audit.engine import AuditReport, SiloAudit, audit
from silofl.audit.report import audit_table, write_audit

__all__ = ["audit", "AuditReport", "SiloAudit", "Canaries", "make_canaries",
           "one_run_epsilon", "one_run_p_value", "one_run_audit", "multi_run_epsilon",
           "one_run_gdp", "fdp_rejects",
           "audit_table", "write_audit"]
