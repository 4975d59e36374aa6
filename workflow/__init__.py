"""Experiment tooling around the `tff_adaptive` library (not installed with it).

bin/ → workflow → tasks → tff_adaptive. This package turns flags into typed
builder arguments (`algorithms`, `cli`, `presets`), runs the training loop
(`program`, `personalization`), sweeps and reports (`sweep`, `report`, `stats`,
`plotting`, `reproduction`). It may import `tasks`; the library never imports it.
"""
