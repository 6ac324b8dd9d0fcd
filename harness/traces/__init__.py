"""Trajectory format: schema, validation, description, importers and the synthetic generator."""
