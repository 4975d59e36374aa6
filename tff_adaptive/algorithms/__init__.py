"""Algorithm builders, one module per paper algorithm.

`build_<algorithm>(model_fn, ...)` returns a `tff.learning.templates.LearningProcess`.
Importing this package changes nothing in TFF: to keep TFF's `worker_binary`
children from outliving the program, call
`tff_adaptive.execution.runtime.track_tff_workers()` (or `use_local_cpp_context()`)
once at the start (docs/library.md).
"""
