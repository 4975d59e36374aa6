"""Algorithm builders (one per paper). Importing them tracks TFF's workers.

Any `worker_binary` that TFF starts in this process, including one for TFF's
default execution context, is stopped when the process exits
(`tff_adaptive.runtime.track_tff_workers`).
"""

from tff_adaptive import runtime as _runtime

_runtime.track_tff_workers()
