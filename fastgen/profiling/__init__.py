"""Memory profiling: what uses the memory of a training run, and where.

* ``snapshot`` - the saved snapshot format (gzip JSON, one file per rank) and safe loading, including the
  conversion of PyTorch's CUDA allocator snapshot (the ``_dump_snapshot`` pickle) into that format;
* ``capture`` - recording: the CUDA allocator's memory history on GPUs, the profiler's memory events on CPU;
* ``analysis`` - blocks and their lifetimes, categories (parameters, gradients, optimizer state, activations,
  other), the timeline, the peak and the largest allocation sites;
* ``report`` - the self-contained HTML report (inline SVG, CSS and a little JS; nothing loaded from a network);
* ``estimate`` - the per-rank estimate of parameter, gradient and optimizer-state memory, computed on the meta
  device without allocating weights.

``fastgen.callbacks.mem_tracker.MemTrackerCallback`` drives the recording during training; ``fastgen
profile-memory`` runs a few iterations with it and ``fastgen profile-memory report SNAPSHOT`` re-renders a
saved snapshot.
"""
