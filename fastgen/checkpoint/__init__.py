"""Checkpoints: *what* is saved and restored (``manager``), in which format (``checkpointer``: its docstring covers
the monolithic and sharded formats), *where* (``stores``: a local folder or S3 behind one interface; ``s3``),
the DCP pieces that read hostile files safely (``dcp_safe``), the run-directory lock (``run_lock``), which
checkpoint a path names (``source``) and conversion between formats (``convert``). ``docs/architecture.md``
draws where it sits."""
