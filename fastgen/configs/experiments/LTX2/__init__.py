"""Recipes for LTX-2, the audio-visual diffusers model (need ``pip install 'fastgen[diffusers]'``)."""
