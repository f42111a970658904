"""Recipes for diffusers-backed Flux models (need ``pip install 'fastgen[diffusers]'``)."""
