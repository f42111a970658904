"""Recipes for Cosmos Predict2, NVIDIA's world foundation models, as diffusers models (need ``pip install 'fastgen[diffusers]'``)."""
