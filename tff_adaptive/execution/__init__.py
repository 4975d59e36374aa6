"""Where rounds run.

  runtime          TFF's local C++ context with tracked workers;
  worker_process   TFF's worker_binary as a child process (bin/worker, tests);
  remote_context   contexts on workers on other machines, faults named;
  data_on_workers  workers build client datasets from client ids;
  parent_death     children that die with their parent;
  tff_patches      every patch of TFF internals, with the TFF version it targets.

Nothing here acts at import; programs call `runtime.track_tff_workers()` /
`use_local_cpp_context()` or `remote_context.set_workers_context()` explicitly.
"""
