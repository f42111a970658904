"""Recipes for diffusers-backed SD models (need ``pip install 'fastgen[diffusers]'``)."""
