"""Empirical privacy auditing: does a silo's claimed ε survive an attack?
(`silofl audit`; see README, "Auditing a guarantee".)

One engine (`engine.one_run`, `engine.multi_run`) over a `Mechanism` plug-in: `tabular`
audits a `silofl run` job; the pandemic pipeline's plug-in lives in `silofl.pandemic.audit`.
DP federated trees (method dp_gbdt) are audited through the same engine by
`gbdt.audit_gbdt` (tree canaries, the server's view of the noisy releases: histograms,
leaf sums — cyclic splits, the default, too — and private bins); `audit` routes a
dp_gbdt job there.
Person-level runs (`[privacy] unit = "person"`) are audited with canary persons of several
rows each (`persons.audit_persons`; `silofl audit` routes such a config there)."""

from silofl.audit.bounds import (
                                 fdp_rejects,
                                 multi_run_epsilon,
                                 one_run_audit,
                                 one_run_epsilon,
                                 one_run_gdp,
                                 one_run_p_value,
)
from silofl.audit.canaries import Canaries, make_canaries
from silofl.audit.engine import (
                                 AuditReport,
                                 Claim,
                                 Mechanism,
                                 SiloAudit,
                                 multi_run,
                                 one_run,
)
from silofl.audit.gbdt import audit_gbdt
from silofl.audit.persons import audit_persons
from silofl.audit.report import audit_table, write_audit
from silofl.audit.tabular import audit

__all__ = ["audit", "audit_persons", "audit_gbdt",
           "AuditReport", "SiloAudit", "Claim", "Mechanism", "one_run", "multi_run",
           "Canaries", "make_canaries",
           "one_run_epsilon", "one_run_p_value", "one_run_audit", "multi_run_epsilon",
           "one_run_gdp", "fdp_rejects",
           "audit_table", "write_audit"]
