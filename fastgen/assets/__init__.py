"""Files that ship with fastgen: the digits teacher (``digits_teacher.pth``, see ``Digits/config_dmd2_digits``), the
digits classifier used by ``fastgen eval`` (``digits_classifier.pt``) and the digits text-to-image pipeline
(``digits_t2i/``, a diffusers ``StableDiffusionPipeline`` folder built by ``scripts/build_digits_t2i.py``; see
``Digits/config_dmd2_t2i_digits``)."""
