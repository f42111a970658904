"""The bridge to diffusers pipelines: sample a run from prompts exactly as the model family's diffusers pipeline
samples (``prompts``: its prompt encoding, its noise draws, its decoding), and export a run as a pipeline folder
that diffusers itself loads and runs with the student's own steps (``export``; ``schedulers`` says which diffusers
scheduler reproduces which fastgen sampler).

It sits above the methods (it asks a method how its student samples) and below the command line
(``fastgen sample --prompt``, ``fastgen convert-ckpt --to diffusers``)."""
