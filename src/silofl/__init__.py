"""silofl: private, personalized cross-silo federated learning."""

__version__ = "0.1.0"
