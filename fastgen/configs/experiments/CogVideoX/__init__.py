"""Recipes for diffusers-backed CogVideoX models (need ``pip install 'fastgen[diffusers]'``)."""
