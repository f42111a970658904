"""Recipes for diffusers-backed Qwen-Image models (need ``pip install 'fastgen[diffusers]'``)."""
