"""Where rounds run: TFF's local C++ context with tracked workers (`runtime`)
and remote TFF workers on other machines (`workers`). Nothing here acts at
import; programs call `runtime.track_tff_workers()` / `use_local_cpp_context()`
or `workers.set_workers_context()` explicitly.
"""
