"""MR-MTL theory on private mean estimation (thesis §1.6, App. D) and the privacy cost of
tuning λ (§1.7, App. E): closed forms, a Monte-Carlo check with the library's own
mechanism, and Fig. 1.7. The model and its assumptions: `silofl.theory.model`.

    from silofl.theory import mean_estimation, simulate, summary
    m = mean_estimation(K=10, n=50, sigma2=1.0, tau2=0.03, clip=5.0, epsilon=4.0,
                        delta=1e-5)            # calibrates each silo's Gaussian noise
    summary(m)["homogeneous"]["lambda_star"]   # λ* = σ_loc²/τ² (Theorem 1.6.3)
    sim = simulate(m, lambdas=[0.1, 1.0], reps=2000, seed=0)   # seeded: a simulation
    sim.mean(), sim.ci()                       # local, fedavg, mrmtl(0.1), mrmtl(1)

Names are loaded on first use, so `silofl --help` does not import NumPy for them.
"""

from importlib import import_module

_EXPORTS = {
    "model": ("MeanEstimation", "THESIS_LAMBDAS", "beating_interval", "fedavg_error",
              "gap_to_fedavg", "gap_to_local", "gaussian_noise_multiplier", "local_error",
              "mean_estimation", "mrmtl_error", "nonlocal_var", "optimal_error",
              "optimal_lambda", "optimum_beats_both", "privacy_gap", "silo_errors",
              "silo_fedavg_errors", "silo_optimal_errors", "silo_optimal_lambdas", "summary",
              "tuned_beats_both"),
    "montecarlo": ("Simulation", "simulate"),
    "tuning_cost": ("naive_grid_epsilon", "repeat_and_select_event", "tnb_gamma", "tnb_mean",
                    "tnb_pmf", "tuned_noise_multiplier"),
    "figures": ("FIG17_PANELS", "fig17", "fig17_numbers"),
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name):
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'silofl.theory' has no attribute {name!r}")
    return getattr(import_module(f"silofl.theory.{mod}"), name)
