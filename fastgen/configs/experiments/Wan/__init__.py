"""Recipes for diffusers-backed Wan models (need ``pip install 'fastgen[diffusers]'``)."""
