"""Recipes for Cosmos 3, NVIDIA's omni world model, as a diffusers model (need ``pip install 'fastgen[diffusers]'``)."""
