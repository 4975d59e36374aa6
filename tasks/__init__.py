"""Federated tasks: TFF `BaselineTask`s with their data and models."""
