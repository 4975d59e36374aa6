"""tff_adaptive: adaptive federated optimisation as TFF building blocks."""
